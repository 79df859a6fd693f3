"""Creating and destroying one MIG device on a simulated GPU, with the driver's rules.

Dynamic MIG (`agent.dynamic_mig`) creates instances one by one at the placement the
scheduler chose, where a static layout is placed all at once (`layout.place`). The rules
are the same (MIG User Guide): MIG mode must be on (the simulator, like gpuslice, never
turns it on); the placement must be one of the profile's starts and its memory slices
free; compute slices add up to at most the GPU's; a profile has a maximum count; at most
one `+me` instance. A refused creation changes nothing, and its message says which rule.

A new instance gets a UUID never used before on that GPU, as NVML gives a re-created
instance a new one: a record of a destroyed instance then never matches its successor.
"""

from __future__ import annotations

from collections.abc import Sequence

from gpuslice.backends.simulated.layout import gi_id_for
from gpuslice.backends.simulated.node import derived_uuid
from gpuslice.core.devices import Gpu, MigDevice
from gpuslice.ports import BackendError, MigGone, MigNotOurs


def created(gpu: Gpu, profile_name: str, start: int, serial: int) -> MigDevice:
    """The MIG device the driver would create on `gpu`; BackendError when it would not."""
    where = f"GPU {gpu.index} ({gpu.uuid})"
    if not gpu.mig_enabled:
        raise BackendError(
            f"{where} is not in MIG mode: no MIG device can be created on it "
            "(gpuslice never changes MIG mode; an operator enables it)"
        )
    geometry = gpu.mig_geometry
    if geometry is None:
        raise BackendError(f"{where} ({gpu.product_name}) has no MIG profiles")
    profile = geometry.profile(profile_name)
    if profile is None:
        known = ", ".join(p.name for p in geometry.profiles)
        raise BackendError(f"{where} has no MIG profile {profile_name!r}; its profiles: {known}")
    if start not in profile.starts:
        starts = ", ".join(str(s) for s in profile.starts)
        raise BackendError(
            f"{where}: {profile.name} cannot start at memory slice {start}; its starts: {starts}"
        )
    live = gpu.mig_devices
    wanted = set(range(start, start + profile.memory_slices))
    for mig in live:
        held = set(range(mig.placement_start, mig.placement_start + mig.placement_size))
        if held & wanted:
            raise BackendError(
                f"{where}: placement {start}:{profile.memory_slices} of {profile.name} overlaps "
                f"{mig.profile} at {mig.placement_start}:{mig.placement_size} (GI {mig.gi_id})"
            )
    used = sum(m.slices_gi for m in live)
    if used + profile.compute_slices > geometry.compute_slices:
        raise BackendError(
            f"{where}: {profile.name} needs {profile.compute_slices} compute slices, "
            f"{geometry.compute_slices - used} of {geometry.compute_slices} are free"
        )
    same = sum(1 for m in live if m.profile == profile.name)
    if same >= profile.max_instances:
        raise BackendError(
            f"{where}: at most {profile.max_instances} {profile.name} instances, {same} exist"
        )
    if profile.media_extensions and any(m.profile.endswith("+me") for m in live):
        raise BackendError(f"{where}: at most one +me instance per GPU, one exists")
    gi_id = gi_id_for(profile, geometry, {m.gi_id for m in live})
    index = min(set(range(len(live) + 1)) - {m.index for m in live})
    seed = f"{gpu.uuid}/{gi_id}/0/{profile.name}@{start}#{serial}"
    return profile.device(
        uuid=derived_uuid("MIG", seed),
        parent_uuid=gpu.uuid,
        parent_index=gpu.index,
        parent_minor=gpu.minor,
        index=index,
        gi_id=gi_id,
        ci_id=0,
        start=start,
    )


def without(gpu: Gpu, mig_uuid: str, gi_id: int, ci_id: int) -> tuple[MigDevice, ...]:
    """`gpu`'s MIG devices less the one at `gi_id`/`ci_id`, which must be `mig_uuid`."""
    live: Sequence[MigDevice] = gpu.mig_devices
    at = [m for m in live if (m.gi_id, m.ci_id) == (gi_id, ci_id)]
    if not at:
        raise MigGone(f"GPU {gpu.uuid} has no GPU instance {gi_id} (CI {ci_id}) any more")
    if at[0].uuid != mig_uuid:
        raise MigNotOurs(
            f"GPU {gpu.uuid}: GI {gi_id} CI {ci_id} is {at[0].uuid} "
            f"({at[0].profile}), not {mig_uuid}: left alone"
        )
    return tuple(m for m in live if m is not at[0])
