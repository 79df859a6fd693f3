"""NVML's MIG profile, placement and instance calls, for dynamic MIG.

The functions take the `pynvml` module (`nv`) as an argument instead of importing it, so
only `backends.nvml` imports the library and tests can hand in a stand-in that keeps
NVML's rules.

- Geometry: each GPU instance profile NVML knows (`nvmlDeviceGetGpuInstanceProfileInfo` for
  every enum index below `NVML_GPU_INSTANCE_PROFILE_COUNT`; NOT_SUPPORTED ones skipped) with
  its possible placements (`nvmlDeviceGetGpuInstancePossiblePlacements`). The profile name
  is rebuilt as for existing instances (`backends.mignames`).
- Create: `nvmlDeviceCreateGpuInstanceWithPlacement` with the profile's ID and the
  placement, then one compute instance spanning it: the CI profile of the same slice count
  with shared engines (`nvmlGpuInstanceGetComputeInstanceProfileInfo`), then
  `nvmlGpuInstanceCreateComputeInstance`.
  When the compute instance fails, the GPU instance just made is destroyed again.
- Destroy: the compute instance, then the GPU instance, looked up by their IDs.
"""

from __future__ import annotations

import ctypes
from typing import Any

from gpuslice.backends.mignames import mig_profile_name
from gpuslice.core.gpumodels import MigGeometry, MigProfile
from gpuslice.ports import BackendError, MigGone

_SUFFIX_BY_ENUM: dict[int, str] = {0x7: "+me", 0xD: "-me", 0xF: "+me.all", 0x10: "+me.all"}
"""GI profile enum indices whose names carry a suffix (graphics profiles are left out:
dynamic MIG offers compute profiles)."""
_GFX_ENUMS = frozenset({0xA, 0xB, 0xC, 0x11})
_CI_ENUM_BY_SLICES = {1: 0x0, 2: 0x1, 3: 0x2, 4: 0x3, 7: 0x4, 8: 0x5, 6: 0x6}
"""`NVML_COMPUTE_INSTANCE_PROFILE_<N>_SLICE` by slice count."""
_MAX_PLACEMENTS = 16


def read_geometry(nv: Any, handle: Any, gpu_mib: int) -> MigGeometry | None:
    """The GPU's MIG profiles with their placements; None when NVML offers none."""
    profiles: list[MigProfile] = []
    seen: set[int] = set()
    memory_slices = 0
    compute_slices = 0
    for enum_index in range(int(nv.NVML_GPU_INSTANCE_PROFILE_COUNT)):
        if enum_index in _GFX_ENUMS:
            continue
        try:
            info = nv.nvmlDeviceGetGpuInstanceProfileInfo(handle, enum_index)
        except nv.NVMLError:
            continue
        profile_id = int(info.id)
        if profile_id in seen or int(info.instanceCount) <= 0:
            continue
        seen.add(profile_id)
        placements = _placements(nv, handle, profile_id)
        if not placements:
            continue
        size = placements[0][1]
        slices = int(info.sliceCount)
        memory_mib = int(info.memorySizeMB)
        name = mig_profile_name(
            gi_slices=slices,
            ci_slices=slices,
            instance_mib=memory_mib,
            gpu_mib=gpu_mib,
            suffix=_SUFFIX_BY_ENUM.get(enum_index, ""),
        )
        profiles.append(
            MigProfile(
                name=name,
                compute_slices=slices,
                memory_slices=size,
                memory_mib=memory_mib,
                multiprocessors=int(info.multiprocessorCount),
                max_instances=int(info.instanceCount),
                starts=tuple(sorted(start for start, _ in placements)),
                copy_engines=int(info.copyEngineCount),
                decoders=int(info.decoderCount),
                jpeg=int(info.jpegCount),
                ofa=int(info.ofaCount),
                encoders=int(info.encoderCount),
                profile_id=profile_id,
            )
        )
        memory_slices = max(memory_slices, *(start + sz for start, sz in placements))
        compute_slices = max(compute_slices, slices)
    if not profiles:
        return None
    profiles.sort(key=lambda p: (p.compute_slices, p.memory_slices, p.name))
    return MigGeometry(memory_slices, compute_slices, tuple(profiles))


def _placements(nv: Any, handle: Any, profile_id: int) -> list[tuple[int, int]]:
    array = (nv.c_nvmlGpuInstancePlacement_t * _MAX_PLACEMENTS)()
    count = ctypes.c_uint(_MAX_PLACEMENTS)
    try:
        nv.nvmlDeviceGetGpuInstancePossiblePlacements(
            handle, profile_id, array, ctypes.byref(count)
        )
    except nv.NVMLError:
        return []
    return [(int(array[i].start), int(array[i].size)) for i in range(int(count.value))]


def create(nv: Any, handle: Any, profile: MigProfile, start: int) -> tuple[int, int]:
    """(GI id, CI id) of a new instance of `profile` at `start`; BackendError otherwise."""
    if profile.profile_id is None:
        raise BackendError(f"MIG profile {profile.name}: NVML gave no profile ID")
    placement = nv.c_nvmlGpuInstancePlacement_t()
    placement.start = start
    placement.size = profile.memory_slices
    try:
        gi = nv.nvmlDeviceCreateGpuInstanceWithPlacement(handle, profile.profile_id, placement)
    except nv.NVMLError as exc:
        raise BackendError(
            f"creating a {profile.name} GPU instance at {start}:{profile.memory_slices}: {exc}"
        ) from None
    try:
        gi_id = int(nv.nvmlGpuInstanceGetInfo(gi).id)
        ci_enum = _CI_ENUM_BY_SLICES.get(profile.compute_slices)
        if ci_enum is None:
            raise BackendError(f"no compute instance profile of {profile.compute_slices} slices")
        ci_info = nv.nvmlGpuInstanceGetComputeInstanceProfileInfo(
            gi, ci_enum, nv.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED
        )
        ci = nv.nvmlGpuInstanceCreateComputeInstance(gi, int(ci_info.id))
        ci_id = int(nv.nvmlComputeInstanceGetInfo(ci).id)
    except (nv.NVMLError, BackendError) as exc:
        try:
            nv.nvmlGpuInstanceDestroy(gi)
        except nv.NVMLError as again:
            raise BackendError(
                f"creating the compute instance of a {profile.name} at {start} failed ({exc}), "
                f"and its GPU instance could not be destroyed again: {again}"
            ) from None
        raise BackendError(
            f"creating the compute instance of a {profile.name} at {start}: {exc}"
        ) from None
    return gi_id, ci_id


def destroy(nv: Any, handle: Any, gi_id: int, ci_id: int) -> None:
    """Destroy compute instance `ci_id` and GPU instance `gi_id`; MigGone when the GPU
    instance is not there."""
    try:
        gi = nv.nvmlDeviceGetGpuInstanceById(handle, gi_id)
    except nv.NVMLError_NotFound:
        raise MigGone(f"no GPU instance {gi_id}") from None
    except nv.NVMLError as exc:
        raise BackendError(f"GPU instance {gi_id}: {exc}") from None
    try:
        ci = nv.nvmlGpuInstanceGetComputeInstanceById(gi, ci_id)
        nv.nvmlComputeInstanceDestroy(ci)
    except nv.NVMLError_NotFound:
        pass  # the compute instance is gone already; the GPU instance goes below
    except nv.NVMLError as exc:
        raise BackendError(f"destroying compute instance {ci_id} of GI {gi_id}: {exc}") from None
    try:
        nv.nvmlGpuInstanceDestroy(gi)
    except nv.NVMLError as exc:
        raise BackendError(f"destroying GPU instance {gi_id}: {exc}") from None
