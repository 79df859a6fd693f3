{{- /* Values of NVIDIA's chart that do not apply here: refused with what to use instead.
     values.schema.json lets them through so that this message, not a bare schema error, is
     what `helm install` prints. */}}
{{- define "gpuslice.nvidiaValues" -}}
{{- if hasKey .Values "compatWithCPUManager" }}
{{- fail "compatWithCPUManager is a value of NVIDIA's chart, not gpuslice's: gpuslice passes devices the kubelet's way (deviceListStrategy) and needs no CPU-manager compatibility mode; remove it (see docs/migrating-from-nvidia.md)" }}
{{- end }}
{{- if hasKey .Values "gfd" }}
{{- fail "gfd is a value of NVIDIA's chart, not gpuslice's: gpuslice writes the GPU Feature Discovery labels itself; remove gfd.* and use labels.mode (file, api or off)" }}
{{- end }}
{{- if hasKey .Values "nfd" }}
{{- fail "nfd is a value of NVIDIA's chart, not gpuslice's: gpuslice does not deploy Node Feature Discovery; install NFD yourself for labels.mode=file, or use labels.mode=api" }}
{{- end }}
{{- if hasKey .Values "devicePlugin" }}
{{- fail "devicePlugin is a value of NVIDIA's chart, not gpuslice's: the device plugin is what this chart runs; remove devicePlugin.*" }}
{{- end }}
{{- if hasKey .Values "legacyDaemonsetAPI" }}
{{- fail "legacyDaemonsetAPI is a value of NVIDIA's chart, not gpuslice's: remove it" }}
{{- end }}
{{- if hasKey .Values "mpsRoot" }}
{{- fail "mpsRoot is a value of NVIDIA's chart, not gpuslice's: use mps.root" }}
{{- end }}
{{- if hasKey .Values "migMonitorDevices" }}
{{- fail "migMonitorDevices is a value of NVIDIA's chart, not gpuslice's: gpuslice always monitors MIG devices; remove it" }}
{{- end }}
{{- if hasKey .Values "passDeviceSpecs" }}
{{- fail "passDeviceSpecs is a value of NVIDIA's chart, not gpuslice's: set flags.plugin.passDeviceSpecs in the config (config.map) instead" }}
{{- end }}
{{- if hasKey .Values "cdi" }}
{{- fail "cdi is a value of NVIDIA's chart, not gpuslice's: use deviceListStrategy: cdi-annotations or cdi-cri" }}
{{- end }}
{{- if hasKey .Values "gdsEnabled" }}
{{- fail "gdsEnabled is a value of NVIDIA's chart, not gpuslice's: set flags.gdsEnabled in the config (config.map) instead" }}
{{- end }}
{{- if hasKey .Values "mofedEnabled" }}
{{- fail "mofedEnabled is a value of NVIDIA's chart, not gpuslice's: set flags.mofedEnabled in the config (config.map) instead" }}
{{- end }}
{{- if hasKey .Values "nvidiaDevRoot" }}
{{- fail "nvidiaDevRoot is a value of NVIDIA's chart, not gpuslice's: set flags.nvidiaDevRoot in the config (config.map), or nvidiaDriverRoot" }}
{{- end }}
{{- if hasKey .Values "selectorLabelsOverride" }}
{{- fail "selectorLabelsOverride is a value of NVIDIA's chart, not gpuslice's: remove it" }}
{{- end }}
{{- if hasKey .Values "gdrcopyEnabled" }}
{{- fail "gdrcopyEnabled is a value of NVIDIA's chart, not gpuslice's: set flags.gdrcopyEnabled in the config (config.map), or extraEnv GDRCOPY_ENABLED" }}
{{- end }}
{{- if hasKey .Values "deviceDiscoveryStrategy" }}
{{- fail "deviceDiscoveryStrategy is a value of NVIDIA's chart, not gpuslice's: gpuslice finds GPUs through NVML; set extraEnv DEVICE_DISCOVERY_STRATEGY if a value must be validated" }}
{{- end }}
{{- end -}}
