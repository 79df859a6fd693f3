"""CDI specs: what the container runtime adds to a container for each device, whichever front
end names the devices.

The runtime finds a device's CDI ID (`<kind>=<name>`) in the spec files of `/var/run/cdi` and
applies its edits. This module builds a spec from the devices' edits and a name for each; the
front end that writes it chooses the kind and the names (DRA: `core.dra.cdispec`, one spec per
claim, names embedding the claim UID).

**Several GPUs in one container.** A container may get several devices: a claim of count 2,
a claim with two requests, two claims. The runtime applies each device's edits in order;
device nodes and mounts add up, but an environment variable set twice keeps the last value.
So what makes a GPU visible must add up. NVIDIA's DRA driver gives each device its own device
nodes (`/dev/nvidia<minor>`, and a MIG device's capability nodes) and sets
`NVIDIA_VISIBLE_DEVICES=void` in the toolkit's common edits, which carry the driver's files
too (`cmd/gpu-kubelet-plugin/cdi.go`, `nvcdi`), so the GPUs a container sees are exactly the
nodes it got. gpuslice does the same where the node's base spec is written
(`core.cdi.driver`: the driver's files, the toolkit's hooks and `void`, once per container),
and then passes `driver_from_base`; without it (no driver files found) the toolkit's legacy
hook must inject the driver, from the device list below. gpuslice's edits per device:

- the GPU's device node, and for a MIG device its GI and CI capability nodes (`core.migcaps`):
  these add up over devices and claims;
- without the base spec, a mount of `/dev/null` at `/var/run/nvidia-container-devices/<UUID>`:
  the device list of the NVIDIA Container Toolkit's `volume-mounts` strategy, which the
  toolkit reads before the environment (`accept-nvidia-visible-devices-as-volume-mounts`), and
  which adds up too;
- without the base spec, `NVIDIA_VISIBLE_DEVICES` with the UUIDs of every device of the same
  request, the same value on each, so a request of count 2 shows both whatever the order. A
  request is the smallest unit a container references (the whole claim, or one of its
  requests), so the list never names a GPU the container did not get; of two requests or two
  claims, the last applied names its own (an environment variable cannot add up). With the
  base spec no device names a GPU there or in the device list: either would have the
  toolkit's runtime inject GPUs beside CDI;
- for an MPS share, the daemon's pipe and shm directories; a share's hints;
- for a capped device (its `memory_limits`), with `caps` given: `NVIDIA_GPU_MEMORY_REQUEST` /
  `NVIDIA_GPU_MEMORY_LIMIT` (MiB) and a `createRuntime` hook running the NVIDIA Container
  Toolkit's `apply-cuda-memory-limits` for that device's GPU (`--gpu-id`), as the toolkit's
  own specs call it. Only when the spec's capped devices share one pair of limits
  (`core.cdi.hook.hook_env_for`: the hook reads one pair per container); the agent never
  passes `caps` on a node that cannot take the limits (cgroup v1: the hook would fail the
  container).

The spec's common edits are the control nodes (`nvidiactl`, `nvidia-uvm`,
`nvidia-uvm-tools`), which the base spec gives too (a node at a path already given replaces
it: harmless twice).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from gpuslice.core.caps import MemoryLimits
from gpuslice.core.cdi.hook import CdiCaps, hook_entry, hook_env_for
from gpuslice.core.jsontypes import Json
from gpuslice.core.migcaps import cap_node

MPS_PIPE_IN_CONTAINER = "/tmp/nvidia-mps"
TOOLKIT_DEVICE_LIST = "/var/run/nvidia-container-devices"
"""Where the NVIDIA Container Toolkit reads a device list from mounts (one per device ID)."""
_NAME = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9_.:-]*[A-Za-z0-9])?$")


@dataclass(frozen=True, slots=True)
class MpsMounts:
    """Host directories of the share's MPS control daemon."""

    pipe_dir: str
    shm_dir: str


@dataclass(frozen=True, slots=True)
class CdiDevice:
    device: str
    """The front end's device name (DRA: `gpu-0`, `gpu-0-mig-1g10gb-19-0`)."""
    uuid: str
    minor: int
    mps: MpsMounts | None = None
    env: Mapping[str, str] | None = None
    request: str = ""
    """The claim's request it was allocated for: devices of one request are listed together
    in `NVIDIA_VISIBLE_DEVICES`, since a container gets a request's devices all or none."""
    mig_caps: tuple[int, ...] = ()
    """A MIG device's GPU and compute instance capability minors (`core.migcaps`)."""
    caps_major: int | None = None
    """The `nvidia-caps` major: the capability nodes are then given by number, for the
    runtime to create (NVIDIA's way: the host needs no such node); None: the host's."""
    memory_limits: MemoryLimits | None = None
    """The holder's memory caps on this device's GPU (DRA: `core.dra.caps`); None: no cap."""


def with_limits(
    devices: Sequence[CdiDevice], limits: Mapping[str, MemoryLimits]
) -> tuple[CdiDevice, ...]:
    """The devices with their holders' caps (by device name, e.g.
    `core.dra.caps.claim_limits`); a device without one keeps none."""
    return tuple(replace(d, memory_limits=limits.get(d.device)) for d in devices)


def checked_name(name: str) -> str:
    """`name` if CDI allows it as a device name, else ValueError."""
    if not _NAME.match(name):
        raise ValueError(f"{name!r} is not a valid CDI device name")
    return name


def device_node(name: str, host_dev_root: str = "/") -> Json:
    """A device node the container sees at `/dev/<name>`. Its `hostPath` is written only
    when the node lives under another dev root on the host (a driver container's root):
    there the runtime must stat `<root>/dev/<name>`, not `/dev/<name>`."""
    path = f"/dev/{name}"
    if host_dev_root.rstrip("/") == "":
        return {"path": path}
    return {"path": path, "hostPath": f"{host_dev_root.rstrip('/')}{path}"}


def device_spec(
    kind: str,
    named: Sequence[tuple[str, CdiDevice]],
    *,
    host_dev_root: str = "/",
    caps: CdiCaps | None = None,
    driver_from_base: bool = False,
) -> Json:
    """A spec file's content (the adapter writes it as YAML): each device under its name.

    `host_dev_root` is the directory on the host that holds the device nodes' `dev/`
    (`host.devroot` decides it as NVIDIA does); `caps` how to call the toolkit's memory
    limits hook, None for no hook (caps off, or a node that cannot take them).
    `driver_from_base`: the container gets the driver from the node's base spec
    (`core.cdi.driver`), so no device names its GPU in `NVIDIA_VISIBLE_DEVICES` or the
    toolkit's device list, which would have the toolkit's runtime inject GPUs again."""
    if not named:
        raise ValueError("a CDI spec needs at least one device")
    devices = [d for _, d in named]
    capped_env: dict[str, str] = {}
    if caps is not None:
        capped_env = hook_env_for({d.device: d.memory_limits for d in devices if d.memory_limits})
    by_request: dict[str, list[str]] = {}
    for d in devices:
        by_request.setdefault(d.request, [])
        if d.uuid not in by_request[d.request]:
            by_request[d.request].append(d.uuid)
    entries: list[Json] = []
    for name, d in named:
        env: dict[str, str] = {}
        if not driver_from_base:
            env["NVIDIA_VISIBLE_DEVICES"] = ",".join(by_request[d.request])
        env.update(d.env or {})
        nodes = [device_node(f"nvidia{d.minor}", host_dev_root)]
        for minor in d.mig_caps:
            if d.caps_major is None:
                nodes.append(device_node(cap_node(minor), host_dev_root))
            else:
                nodes.append(
                    {"path": f"/dev/{cap_node(minor)}", "type": "c", "major": d.caps_major,
                     "minor": minor}
                )  # fmt: skip
        mounts: list[Json] = []
        if d.mps is not None:
            env["CUDA_MPS_PIPE_DIRECTORY"] = MPS_PIPE_IN_CONTAINER
            options = ["rw", "nosuid", "nodev", "bind"]
            mounts += [
                {"hostPath": d.mps.pipe_dir, "containerPath": MPS_PIPE_IN_CONTAINER,
                 "options": options},
                {"hostPath": d.mps.shm_dir, "containerPath": "/dev/shm", "options": options},
            ]  # fmt: skip
        if not driver_from_base:
            mounts.append(
                {"hostPath": "/dev/null", "containerPath": f"{TOOLKIT_DEVICE_LIST}/{d.uuid}",
                 "options": ["ro", "nosuid", "nodev", "bind"]}
            )  # fmt: skip
        edits: Json = {
            "env": [f"{k}={v}" for k, v in env.items()],
            "deviceNodes": nodes,
            "mounts": mounts,
        }
        if caps is not None and capped_env and d.memory_limits is not None:
            edits["env"] += [f"{k}={v}" for k, v in capped_env.items()]
            edits["hooks"] = [hook_entry(caps.hook_path, [d.uuid], caps.driver_root)]
        entries.append({"name": checked_name(name), "containerEdits": edits})
    common = [
        device_node(n, host_dev_root) for n in ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools")
    ]
    return {
        "cdiVersion": minimum_version(entries, common),
        "kind": kind,
        "devices": entries,
        "containerEdits": {"deviceNodes": common},
    }


def minimum_version(devices: Sequence[Json], common_nodes: Sequence[Json] = ()) -> str:
    """The lowest `cdiVersion` that allows these devices (runtimes vendor old CDI
    libraries that refuse versions they do not know): 0.5.0 once a name starts with a
    digit (claim UIDs often do) or a device node has a `hostPath` (both came with 0.5.0,
    the CDI library's `requiresV050`), 0.3.0 otherwise."""
    nodes = [*common_nodes]
    for d in devices:
        nodes.extend(d.get("containerEdits", {}).get("deviceNodes", ()))
    if any(str(d["name"])[:1].isdigit() for d in devices) or any("hostPath" in n for n in nodes):
        return "0.5.0"
    return "0.3.0"
