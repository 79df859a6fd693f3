{{- define "gpuslice.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "gpuslice.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "gpuslice.namespace" -}}
{{- default .Release.Namespace .Values.namespaceOverride }}
{{- end }}

{{- define "gpuslice.selectorLabels" -}}
app.kubernetes.io/name: {{ include "gpuslice.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "gpuslice.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "gpuslice.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "gpuslice.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "gpuslice.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The ConfigMap holding the named configs: the user's (config.name) or ours. */}}
{{- define "gpuslice.configMapName" -}}
{{- if .Values.config.name }}
{{- .Values.config.name }}
{{- else if .Values.config.map }}
{{- printf "%s-configs" (include "gpuslice.fullname" .) }}
{{- end }}
{{- end }}

{{/* Checks NVIDIA's chart makes, plus ours; each message says what to change. */}}
{{- define "gpuslice.validate" -}}
{{- include "gpuslice.nvidiaValues" . }}
{{- include "gpuslice.validateDra" . }}
{{- include "gpuslice.validateMps" . }}
{{- include "gpuslice.validatePorts" . }}
{{- include "gpuslice.validateExtraEnv" . }}
{{- if and .Values.config.name .Values.config.map }}
{{- fail "config.name and config.map are both set: use an existing ConfigMap (config.name) or list configs here (config.map), not both" }}
{{- end }}
{{- if and (eq (include "gpuslice.namespace" .) "default") (not .Values.allowDefaultNamespace) }}
{{- fail "installing into the 'default' namespace: choose a namespace (-n gpuslice) or set allowDefaultNamespace=true" }}
{{- end }}
{{- if not (has .Values.labels.mode (list "file" "api" "off")) }}
{{- fail (printf "labels.mode=%v: must be one of file, api, off" .Values.labels.mode) }}
{{- end }}
{{- range .Values.config.fallbackStrategies }}
{{- if not (has . (list "named" "single" "empty")) }}
{{- fail (printf "config.fallbackStrategies: unknown fallback strategy %v (accepted: named, single, empty)" .) }}
{{- end }}
{{- end }}
{{- if .Values.config.map }}
{{- if and .Values.config.default (not (hasKey .Values.config.map .Values.config.default)) }}
{{- fail (printf "config.default=%v is not a key of config.map (keys: %s)" .Values.config.default (keys .Values.config.map | sortAlpha | join ", ")) }}
{{- end }}
{{- if and (gt (len .Values.config.map) 1) (not .Values.config.default) }}
{{- $named := and (has "named" .Values.config.fallbackStrategies) (hasKey .Values.config.map "default") }}
{{- $empty := has "empty" .Values.config.fallbackStrategies }}
{{- if not (or $named $empty) }}
{{- fail "config.map has several configs but no config.default, no config named 'default' with the 'named' fallback, and no 'empty' fallback: unlabelled nodes would have no config" }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}

{{/*
Host PID namespace: only for per-pod attribution (metrics.hostPID, read by the metrics and
the memory guard), for a memory guard that enforces (it must map the GPU's host PIDs to
pods and signal them), or for the MPS control daemon (MPS on, gpuslice.mpsOn: mps.enabled or a
config in config.map with sharing.mps; with mps.enableHostPID).
*/}}
{{- define "gpuslice.hostPID" -}}
{{- $attribution := and (or .Values.metrics.enabled (ne .Values.memoryGuard.mode "off")) .Values.metrics.hostPID -}}
{{- $mps := eq (include "gpuslice.mpsOn" .) "true" -}}
{{- or $attribution (eq .Values.memoryGuard.mode "enforce") (and $mps .Values.mps.enableHostPID) -}}
{{- end }}

{{/*
The container's securityContext: `securityContext` when set; privileged with MPS on (gpuslice.mpsOn)
(compute modes, the MPS control daemon); otherwise nothing beyond running as root, which
the root-owned host directories (device-plugins, features.d) need for writing (the image's
own default user is non-root), plus CAP_KILL for a memory guard that kills.
*/}}
{{- define "gpuslice.securityContext" -}}
{{- if .Values.securityContext }}
{{- toYaml .Values.securityContext }}
{{- else if eq (include "gpuslice.mpsOn" .) "true" }}
privileged: true
readOnlyRootFilesystem: true
runAsUser: 0
{{- else }}
privileged: false
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
runAsUser: 0
capabilities:
  drop: ["ALL"]
  {{- $kill := and (eq .Values.memoryGuard.mode "enforce") (eq .Values.memoryGuard.action "kill") }}
  {{- $caps := eq (include "gpuslice.capsOn" .) "true" }}
  {{- if or $kill $caps }}
  # KILL: the memory guard signals other pods' GPU processes, which run as other users;
  # SYS_ADMIN: memory caps (the driver's limits calls are for the administrator only)
  add: [{{ if $kill }}"KILL"{{ end }}{{ if and $kill $caps }}, {{ end }}{{ if $caps }}"SYS_ADMIN"{{ end }}]
  {{- end }}
seccompProfile:
  type: RuntimeDefault
{{- end }}
{{- end }}

{{/*
DRA mode: the names of the DeviceClasses for one device type ("gpu" or "mig"). NVIDIA's
driver name gpu.nvidia.com gives NVIDIA's classes gpu.nvidia.com and mig.nvidia.com; any
driver name gpu.<rest> gives <type>.<rest> the same way; any other name <type>.<driver>.
Called with (list <type> <driverName>).
*/}}
{{- define "gpuslice.draClassName" -}}
{{- $type := index . 0 }}
{{- $driver := index . 1 }}
{{- if hasPrefix "gpu." $driver }}
{{- printf "%s.%s" $type (trimPrefix "gpu." $driver) }}
{{- else }}
{{- printf "%s.%s" $type $driver }}
{{- end }}
{{- end }}

{{/* DRA mode: the directory of the agent's dra.sock and checkpoint. */}}
{{- define "gpuslice.draPluginDir" -}}
{{- printf "%s/%s" (trimSuffix "/" .Values.dra.kubeletPluginsDir) .Values.dra.driverName }}
{{- end }}

{{/*
"true" when MPS is on as far as the chart can tell: mps.enabled, or a config in config.map
whose sharing has an `mps` section. A ConfigMap of the user's (config.name) cannot be read
here, so with it only mps.enabled counts (docs/install.md, "MPS").
*/}}
{{- define "gpuslice.mpsOn" -}}
{{- if or .Values.mps.enabled (include "gpuslice.mpsConfigs" .) }}true{{ end -}}
{{- end }}

{{/* The names of the configs in config.map whose sharing has an `mps` section, comma-separated. */}}
{{- define "gpuslice.mpsConfigs" -}}
{{- $names := list -}}
{{- range $name, $text := .Values.config.map -}}
{{- $config := fromYaml (toString ($text | default "")) -}}
{{- if and (kindIs "map" $config) (kindIs "map" $config.sharing) (hasKey $config.sharing "mps") -}}
{{- $names = append $names $name -}}
{{- end -}}
{{- end -}}
{{- join ", " $names -}}
{{- end }}

{{/*
Why MPS gets its privileges, for NOTES: mps.enabled, or the configs that use MPS. NVIDIA's
chart starts the MPS daemon from the config alone, so its values files never set
mps.enabled: a config.map with sharing.mps gets what MPS needs without it.
*/}}
{{- define "gpuslice.mpsWhy" -}}
{{- if .Values.mps.enabled }}mps.enabled{{ else }}config.map uses sharing.mps ({{ include "gpuslice.mpsConfigs" . }}){{ end -}}
{{- end }}

{{/*
The DaemonSet's updateStrategy: `updateStrategy` as given, except that in DRA mode or with
MPS on (gpuslice.mpsOn) a rolling update is pinned to maxSurge 0. In DRA mode a surge pod
would be a second kubelet plugin on the node with the same socket names (the kubelet's
rolling-update mode with per-pod socket names is not supported); with MPS, two agents on
one node would both supervise the MPS control daemon every MPS pod's clients use (each
restarts it when it looks down, each applies its own config's limits). A maxSurge other
than 0 is refused in gpuslice.validate.
*/}}
{{- define "gpuslice.updateStrategy" -}}
{{- $strategy := deepCopy (.Values.updateStrategy | default dict) }}
{{- $pinned := or .Values.dra.enabled (eq (include "gpuslice.mpsOn" .) "true") }}
{{- if and $pinned (eq (toString ($strategy.type | default "RollingUpdate")) "RollingUpdate") }}
{{- $rolling := deepCopy ($strategy.rollingUpdate | default dict) }}
{{- $_ := set $rolling "maxSurge" 0 }}
{{- $_ = set $strategy "type" "RollingUpdate" }}
{{- $_ = set $strategy "rollingUpdate" $rolling }}
{{- end }}
{{- toYaml $strategy }}
{{- end }}

{{/* DRA mode checks; each message says what to change. */}}
{{- define "gpuslice.validateDra" -}}
{{- if .Values.dra.enabled }}
{{- $strategy := .Values.updateStrategy | default dict }}
{{- $rolling := $strategy.rollingUpdate | default dict }}
{{- if hasKey $rolling "maxSurge" }}
{{- if not (has (toString $rolling.maxSurge) (list "0" "0%")) }}
{{- fail (printf "updateStrategy.rollingUpdate.maxSurge=%v with dra.enabled: a DRA kubelet plugin must be replaced with maxSurge 0 (two agents on one node would share the kubelet plugin's socket names); remove maxSurge or set it to 0" $rolling.maxSurge) }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}

{{/* MPS checks (gpuslice.mpsOn); each message says what to change. DRA mode has its own. */}}
{{- define "gpuslice.validateMps" -}}
{{- if and (not .Values.dra.enabled) (eq (include "gpuslice.mpsOn" .) "true") }}
{{- $strategy := .Values.updateStrategy | default dict }}
{{- $rolling := $strategy.rollingUpdate | default dict }}
{{- if hasKey $rolling "maxSurge" }}
{{- if not (has (toString $rolling.maxSurge) (list "0" "0%")) }}
{{- $why := ternary "mps.enabled" "a config in config.map with sharing.mps" .Values.mps.enabled }}
{{- fail (printf "updateStrategy.rollingUpdate.maxSurge=%v with MPS on (%s): the agent must be replaced with maxSurge 0 (two agents on one node would both manage the MPS control daemon every MPS pod's clients use); remove maxSurge or set it to 0" $rolling.maxSurge $why) }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}

{{/*
Memory caps on (memoryCaps.mode auto): the host's cgroup tree, CAP_SYS_ADMIN, the pods'
assignments (PodResources) and names (list/watch Pods), and in DRA mode the hook's directory.
*/}}
{{- define "gpuslice.capsOn" -}}
{{- eq (toString .Values.memoryCaps.mode) "auto" -}}
{{- end }}

{{/*
Who reads which pod holds which GPU through the kubelet's PodResources socket: the metrics'
per-pod attribution, the memory guard (any mode but off) and memory caps.
*/}}
{{- define "gpuslice.podResources" -}}
{{- or .Values.metrics.enabled (ne .Values.memoryGuard.mode "off") (eq (include "gpuslice.capsOn" .) "true") -}}
{{- end }}

{{/*
Ports the agent would refuse or could not bind; each message names the value to change.
The agent refuses a metrics port equal to the probes' port (AgentSettings.problems), and
under hostNetwork 9400 is the port NVIDIA's dcgm-exporter binds on the node.
*/}}
{{- define "gpuslice.validatePorts" -}}
{{- if eq (toString .Values.metrics.port) (toString .Values.probes.port) }}
{{- fail (printf "metrics.port and probes.port are both %v: the probes have a listener of their own, so the agent refuses one port for both; set probes.port (default 9401) or metrics.port to another port" .Values.metrics.port) }}
{{- end }}
{{- if and .Values.hostNetwork (eq (toString .Values.metrics.port) "9400") }}
{{- fail "hostNetwork=true binds metrics.port 9400 on the node itself, the port NVIDIA's dcgm-exporter listens on there: set metrics.port to a port free on your GPU nodes (e.g. --set metrics.port=9402)" }}
{{- end }}
{{- end }}

{{/*
extraEnv against the agent's own checks (knobs.json, written from the agent's knobs by
scripts/gen-chart-knobs): a variable the chart sets from a value is refused (the later
entry would silently win over the value), and a value the agent would refuse at start
(not one of its choices, not a number, out of range, not a boolean) fails the install
instead of crash-looping the pod.
*/}}
{{- define "gpuslice.validateExtraEnv" -}}
{{- $knobs := .Files.Get "knobs.json" | fromJson -}}
{{- range $i, $entry := .Values.extraEnv }}
{{- $name := toString $entry.name }}
{{- $knob := get $knobs $name }}
{{- if $knob }}
{{- if $knob.chart }}
{{- fail (printf "extraEnv[%d] sets %s, which the chart sets from %s: set %s instead" $i $name $knob.chart $knob.chart) }}
{{- end }}
{{- if hasKey $entry "value" }}
{{- $value := toString $entry.value }}
{{- $where := printf "extraEnv[%d] %s=%q (%s)" $i $name $value $knob.flag }}
{{- if and $knob.enum (not (has $value $knob.enum)) }}
{{- fail (printf "%s: the agent takes one of %s" $where (join ", " $knob.enum)) }}
{{- end }}
{{- if and $knob.pattern (not (regexMatch $knob.pattern $value)) }}
{{- fail (printf "%s: the agent would refuse it (it takes %s)" $where (ternary "a boolean" "a number" (contains "true" $knob.pattern))) }}
{{- end }}
{{- if hasKey $knob "min" }}
{{- if or (lt (float64 $value) (float64 $knob.min)) (and $knob.minOpen (eq (float64 $value) (float64 $knob.min))) }}
{{- fail (printf "%s: the agent takes %s %v" $where (ternary "more than" "at least" (default false $knob.minOpen)) $knob.min) }}
{{- end }}
{{- end }}
{{- if hasKey $knob "max" }}
{{- if gt (float64 $value) (float64 $knob.max) }}
{{- fail (printf "%s: the agent takes at most %v" $where $knob.max) }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}
