"""CDI, the room both front ends use: what the container runtime adds to a container for a
device, and the NVIDIA Container Toolkit's memory-limits hook.

- `core.cdi.spec`: the spec model (`CdiDevice`: one device's node, env, mounts, and its
  holder's memory limits) and its builders (device nodes, the toolkit's device-list mounts,
  the hook entry per capped device, the minimum `cdiVersion`), with no front end's naming:
  DRA's claim specs (`core.dra.cdispec`: the claim kind, names embedding the claim UID) are
  built on it.
- `core.cdi.driver`: the node's base spec for DRA, as NVIDIA's standard spec: the driver's
  files (which names, where the toolkit looks; `host.driverfiles` finds them), the toolkit's
  library hooks and `NVIDIA_VISIBLE_DEVICES=void`, applied once per container however many
  claims it holds, so claims' GPUs add up.
- `core.cdi.hook`: the toolkit's `apply-cuda-memory-limits` hook: its entry, its two
  variables, and `hook_env_for`, the one rule for which limits reach the hook for the devices
  of one container, which DRA's claim specs and the device plugin's Allocate both call.

Pure: no I/O (the adapter `host.cdi_store` writes the files).
"""
