"""The CDI spec of a dynamically created MIG device: what a static MIG device of the same
profile gets (its GPU's node, its GI and CI capability nodes, its UUID), from the device the
publisher's functions give once gpuslice created the instance."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuslice.agent.dynamic_mig import JOURNAL_NAME, DynamicMig
from gpuslice.backends import open_backend
from gpuslice.backends.simulated import SimulatedBackend
from gpuslice.core.dra.cdispec import cdi_id, claim_spec
from gpuslice.core.dra.claims import ClaimError, claim_work
from gpuslice.core.dra.kubelet_api import ClaimRef
from gpuslice.core.dra.partitions import dynamic_gpu, dynamic_gpus, node_devices
from gpuslice.core.dra.preparation import preparation
from gpuslice.core.dra.publish import DraDevice, dra_devices
from gpuslice.core.jsontypes import Json
from gpuslice.core.migcaps import numbered_minors
from gpuslice.host.checkpoint_file import CheckpointFile
from gpuslice.testing.cdirun import inject

UID = "0f0f0f0f-1111-2222-3333-444444444444"
NAME = "gpu-1-mig-3g40gb-9-4"


def claim(device: str) -> dict[str, object]:
    result = {"request": "mig", "driver": "gpu.nvidia.com", "pool": "n1", "device": device}
    return {"metadata": {"uid": UID}, "status": {"allocation": {"devices": {"results": [result]}}}}


def devices(backend: SimulatedBackend, ours: frozenset[str]) -> dict[str, DraDevice]:
    inventory = backend.inventory()
    dyn = dynamic_gpus(inventory, {"all"}, ours)
    return {d.name: d for d in node_devices(dra_devices(inventory), dyn)}


async def test_the_created_instance_gets_a_static_mig_devices_cdi_spec(tmp_path: Path) -> None:
    backend = open_backend("sim:2xh100-80gb/mig=")
    assert isinstance(backend, SimulatedBackend)
    before = devices(backend, frozenset())
    ref = ClaimRef("ns", UID, "c")
    early = claim_work(claim(NAME), ref, driver="gpu.nvidia.com", pool="n1",
                       devices=before, offers={})  # fmt: skip
    with pytest.raises(ClaimError, match="has not been created"):
        preparation(early, "/plug/mps")

    dyn = DynamicMig(backend, CheckpointFile(tmp_path / JOURNAL_NAME), "b")
    await dyn.load(set())
    inventory = backend.inventory()
    part = dynamic_gpu(inventory.gpus[1], inventory).partitions[NAME]
    mig = await dyn.materialize(UID, part)

    after = devices(backend, dyn.ours())
    assert after[NAME].mig == mig
    work = claim_work(claim(NAME), ref, driver="gpu.nvidia.com", pool="n1",
                      devices=after, offers={})  # fmt: skip
    (cdi,) = preparation(work, "/plug/mps").cdi
    seen = inject([claim_spec(UID, [cdi], host_dev_root="/")], [cdi_id(UID, NAME)])
    gi, ci = numbered_minors(1, mig.gi_id, mig.ci_id)
    assert set(seen.device_nodes) >= {
        "/dev/nvidia1",
        f"/dev/nvidia-caps/nvidia-cap{gi}",
        f"/dev/nvidia-caps/nvidia-cap{ci}",
    }
    assert seen.env["NVIDIA_VISIBLE_DEVICES"] == mig.uuid
    assert await dyn.release(UID) == ""
    assert backend.inventory().gpus[1].mig_devices == ()


async def test_nvidias_mps_config_applies_to_a_created_mig_device(tmp_path: Path) -> None:
    """A `MigDeviceConfig` with MPS, where NVIDIA allows MPS: the created MIG device gets its
    own daemon serving it, as a static MIG device does."""
    from gpuslice.core.dra.preparation import StartDaemon

    backend = open_backend("sim:2xh100-80gb/mig=")
    assert isinstance(backend, SimulatedBackend)
    dyn = DynamicMig(backend, CheckpointFile(tmp_path / JOURNAL_NAME), "b")
    await dyn.load(set())
    inventory = backend.inventory()
    mig = await dyn.materialize(UID, dynamic_gpu(inventory.gpus[1], inventory).partitions[NAME])
    obj = claim(NAME)
    params = {
        "apiVersion": "resource.nvidia.com/v1beta1",
        "kind": "MigDeviceConfig",
        "sharing": {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 50}},
    }
    allocation: Json = obj["status"]["allocation"]  # type: ignore[index]
    allocation["devices"]["config"] = [
        {"source": "FromClaim", "opaque": {"driver": "gpu.nvidia.com", "parameters": params}}
    ]
    work = claim_work(obj, ClaimRef("ns", UID, "c"), driver="gpu.nvidia.com", pool="n1",
                      devices=devices(backend, dyn.ours()), offers={})  # fmt: skip
    (step,) = preparation(work, "/plug/mps").steps
    assert isinstance(step, StartDaemon)
    assert step.spec.mig_uuids == (mig.uuid,)
    assert await dyn.release(UID) == ""
