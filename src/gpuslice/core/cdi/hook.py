"""The NVIDIA Container Toolkit's memory-limits hook, as CDI specs and Allocate give it work.

NVIDIA's container toolkit, from v1.20.1, ships `nvidia-cdi-hook apply-cuda-memory-limits`
(OCI stage `createRuntime`: after the container's cgroup exists, before its process runs).
It reads `NVIDIA_GPU_MEMORY_REQUEST` (soft) and `NVIDIA_GPU_MEMORY_LIMIT` (hard) in whole MiB
from the container's environment, takes the first occurrence of each, and sets them on every
GPU it is given (`--gpu-id`), for the container's cgroup; it fails the container on cgroup
v1 and when the request is above the limit.

So the hook reads **one pair per container**, whatever the number of GPUs it names: the
devices of one container get the hook's variables only when they all want the same limits
(`hook_env_for`, the one rule both front ends call: DRA's claim specs, `core.dra.cdispec`,
and the device plugin's Allocate, `core.allocation.caps`). Otherwise nothing is given to the
hook, and the agent applies and checks the limits itself after the container starts
(`agent.caps`). Limits the hook would refuse are never given either: a Prepare or an
Allocate never fails because of caps.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from gpuslice.core.caps import MemoryLimits
from gpuslice.core.units import MIB

HOOK_NAME = "apply-cuda-memory-limits"
DEFAULT_HOOK_PATH = "/usr/bin/nvidia-cdi-hook"
"""Where the NVIDIA Container Toolkit installs `nvidia-cdi-hook` (its CDI specs' default)."""
HOOK_LIFECYCLE = "createRuntime"
"""The OCI stage the toolkit gives this hook (`getOCIHookType`: create-runtime, after the
container's cgroup exists and before its process runs), not createContainer."""


@dataclass(frozen=True, slots=True)
class CdiCaps:
    """How a spec gpuslice writes calls the toolkit's hook (`--memory-caps-hook-path`)."""

    hook_path: str
    driver_root: str = ""


class CapsRequestError(ValueError):
    """Limits that cannot be asked for (a request above the limit, a negative size)."""


def hook_env(limits: MemoryLimits) -> dict[str, str]:
    """The environment the toolkit's `apply-cuda-memory-limits` hook reads: integers in MiB
    (`NVIDIA_GPU_MEMORY_REQUEST` the soft limit, `NVIDIA_GPU_MEMORY_LIMIT` the hard one). Both
    are rounded down to the MiB, so the hook never sets more than the entitlement; a request
    above the limit is refused here, where the hook would fail the container."""
    request = limits.soft_bytes // MIB
    limit = limits.hard_bytes // MIB
    if limits.soft_bytes < 0 or limits.hard_bytes < 0:
        raise CapsRequestError(f"negative memory limits: {limits}")
    if request > limit:
        raise CapsRequestError(
            f"memory request {request} MiB is above the limit {limit} MiB; the hook would "
            "refuse the container"
        )
    return {"NVIDIA_GPU_MEMORY_REQUEST": str(request), "NVIDIA_GPU_MEMORY_LIMIT": str(limit)}


def hook_argv(hook_path: str, name: str) -> list[str]:
    """A toolkit hook's `argv` up to its subcommand `name`, as the toolkit's own specs write
    it (`cdiHookCreator.Create`): `argv[0]` is the binary's name, and `nvidia-ctk` takes
    `hook` before the subcommand."""
    base = hook_path.rstrip("/").rsplit("/", 1)[-1]
    return [base, "hook", name] if base == "nvidia-ctk" else [base, name]


def hook_entry(
    hook_path: str, gpu_uuids: Iterable[str], driver_root: str = ""
) -> dict[str, object]:
    """One CDI hook entry running `apply-cuda-memory-limits` for `gpu_uuids`. Its arguments
    follow the toolkit's own specs (`hook_argv`), the flags `--driver-root` then one
    `--gpu-id` per GPU."""
    args = hook_argv(hook_path, HOOK_NAME)
    args += ["--driver-root", driver_root]
    for uuid in gpu_uuids:
        args += ["--gpu-id", uuid]
    return {"hookName": HOOK_LIFECYCLE, "path": hook_path, "args": args}


def hook_limits(limits: Mapping[str, MemoryLimits]) -> MemoryLimits | None:
    """The one pair the hook can be given for these devices (by any key: a DRA device name,
    a GPU UUID), None when they need different ones (or none): the agent then applies them
    itself."""
    distinct = set(limits.values())
    return next(iter(distinct)) if len(distinct) == 1 else None


def hook_env_for(limits: Mapping[str, MemoryLimits]) -> dict[str, str]:
    """What the toolkit's hook is given for the capped devices of one container: the two
    variables of the one pair they share, or nothing where they need different pairs (the
    hook would give one GPU another's limits), none, or a pair the hook would refuse (it
    would fail the container). The one rule: DRA's claim specs and the device plugin's
    Allocate both ask it."""
    pair = hook_limits(limits)
    if pair is None:
        return {}
    try:
        return hook_env(pair)
    except CapsRequestError:
        return {}
