"""MPS where NVIDIA's driver allows it: a `MigDeviceConfig` with MPS gets a daemon serving
its MIG devices (their UUIDs its `CUDA_VISIBLE_DEVICES`, its ID hashed from them, limits by
their place among them), and `mpsConfig.multiUser` a daemon started with `-M`. Claim ->
preparation, with no I/O; and the record that lets a restarted agent rebuild the daemon."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from gpuslice.backends import open_backend
from gpuslice.core.dra.claims import ClaimError, claim_daemon_key, claim_work
from gpuslice.core.dra.kubelet_api import ClaimRef
from gpuslice.core.dra.preparation import StartDaemon, preparation
from gpuslice.core.dra.prepared import (
    AppliedSharing,
    Checkpoint,
    PreparedClaim,
    decode,
    encode,
    sealed,
)
from gpuslice.core.dra.publish import DraDevice, dra_devices
from gpuslice.core.jsontypes import Json

DRIVER = "gpu.nvidia.com"
POOL = "n1"
REF = ClaimRef("ns", "uid-1", "c")
NVIDIA = "resource.nvidia.com/v1beta1"
MIG_NODE = "sim:2xa100-40gb/mig=3g.20gb*1+2g.10gb*1+1g.5gb*2"
ROOT = "/plug/mps"


def devices(node: str) -> dict[str, DraDevice]:
    backend = open_backend(node)
    try:
        return {d.name: d for d in dra_devices(backend.inventory())}
    finally:
        backend.close()


MIG = devices(MIG_NODE)
GPUS = devices("sim:2xh100-80gb")


def mps_claim(names: list[str], kind: str, mps_config: Json | None = None) -> Any:
    sharing: Json = {"strategy": "MPS"}
    if mps_config is not None:
        sharing["mpsConfig"] = mps_config
    params = {"apiVersion": NVIDIA, "kind": kind, "sharing": sharing}
    return {
        "metadata": {"uid": REF.uid},
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {"request": f"r{i}", "driver": DRIVER, "pool": POOL, "device": name}
                        for i, name in enumerate(names)
                    ],
                    "config": [
                        {"source": "FromClaim", "opaque": {"driver": DRIVER, "parameters": params}}
                    ],
                }
            }
        },
    }


def prepare(obj: Any, devs: dict[str, DraDevice]) -> Any:
    work = claim_work(obj, REF, driver=DRIVER, pool=POOL, devices=devs, offers={})
    return preparation(work, ROOT)


def test_a_mig_devices_mps_config_gets_a_daemon_serving_that_mig_device() -> None:
    name = "gpu-0-mig-2g10gb-14-2"
    mig = MIG[name]
    config = {"defaultActiveThreadPercentage": 40, "defaultPinnedDeviceMemoryLimit": "6Gi"}
    prep = prepare(mps_claim([name], "MigDeviceConfig", config), MIG)
    (step,) = prep.steps
    assert isinstance(step, StartDaemon)
    spec = step.spec
    # NVIDIA's daemon: CUDA_VISIBLE_DEVICES is the MIG device, its ID hashed from its UUID
    assert spec.mig_uuids == (mig.uuid,)
    assert mig.uuid.startswith("MIG-")
    assert spec.resource == claim_daemon_key(REF.uid, [mig.uuid])
    assert spec.resource != claim_daemon_key(REF.uid, [mig.gpu.uuid])
    # the GPU it lives on: what the driver locks; its compute mode is left alone
    assert (spec.gpu_uuids, spec.gpu_indices) == ((mig.gpu.uuid,), (mig.gpu.index,))
    assert spec.pipe_dir == f"{ROOT}/{spec.resource}/pipe"
    # the daemon sees one device, its 0: the limit goes there, whatever the GPU's index
    assert spec.commands == (
        "set_default_device_pinned_mem_limit 0 6144M",
        "set_default_active_thread_percentage 40",
    )
    assert spec.start_args == ("-d",)
    assert step.record == AppliedSharing(
        "MPS",
        (mig.gpu.uuid,),
        mps_key=spec.resource,
        thread_percentage=40,
        limits_mib=((0, 6144),),
        mig_uuids=(mig.uuid,),
    )
    (cdi,) = prep.cdi
    assert (cdi.uuid, cdi.mps) == (mig.uuid, replace(cdi.mps, pipe_dir=spec.pipe_dir))
    assert cdi.mps is not None
    assert cdi.mps.shm_dir == spec.shm_dir
    assert cdi.mig_caps  # still the MIG device's own capability nodes
    (use,) = prep.uses
    assert (use.physical_uuid, use.strategy, use.entitlement_mib) == (mig.uuid, "mps", 6144)


def test_mig_devices_of_one_config_share_a_daemon_keyed_as_nvidia_sorts_them() -> None:
    """NVIDIA sorts the group's UUIDs for the daemon's ID, its CUDA_VISIBLE_DEVICES and
    what a limit's index means; a MIG device on each GPU makes one daemon over both GPUs."""
    names = ["gpu-1-mig-1g5gb-19-0", "gpu-0-mig-3g20gb-9-4"]
    uuids = sorted(MIG[n].uuid for n in names)
    limits = {"0": "1Gi", uuids[1]: "2Gi"}
    prep = prepare(mps_claim(names, "MigDeviceConfig", {
        "defaultPerDevicePinnedMemoryLimit": limits}), MIG)  # fmt: skip
    (step,) = prep.steps
    assert isinstance(step, StartDaemon)
    assert step.spec.mig_uuids == tuple(uuids)
    assert step.spec.resource == claim_daemon_key(REF.uid, uuids)
    assert set(step.spec.gpu_uuids) == {MIG[n].gpu.uuid for n in names}
    assert step.spec.pinned_mem_limits_mib == ((0, 1024), (1, 2048))
    by_uuid = {u.physical_uuid: u.entitlement_mib for u in prep.uses}
    assert by_uuid == {uuids[0]: 1024, uuids[1]: 2048}


def test_a_limit_key_outside_the_mig_devices_is_refused_naming_it() -> None:
    obj = mps_claim(["gpu-0-mig-1g5gb-19-0"], "MigDeviceConfig",
                    {"defaultPerDevicePinnedMemoryLimit": {"1": "1Gi"}})  # fmt: skip
    with pytest.raises(ClaimError, match=r"key '1' is neither a UUID .* nor an index below 1"):
        prepare(obj, MIG)


@pytest.mark.parametrize(
    ("devs", "name", "kind"),
    [(GPUS, "gpu-1", "GpuConfig"), (MIG, "gpu-1-mig-1g5gb-19-1", "MigDeviceConfig")],
)
def test_multi_user_starts_the_daemon_with_dash_m_and_records_it(
    devs: dict[str, DraDevice], name: str, kind: str
) -> None:
    *_, step = prepare(mps_claim([name], kind, {"multiUser": True}), devs).steps
    assert isinstance(step, StartDaemon)
    assert step.spec.multi_user
    assert step.spec.start_args == ("-d", "-M")
    assert step.record.multi_user
    *_, plain = prepare(mps_claim([name], kind, {"multiUser": False}), devs).steps
    assert isinstance(plain, StartDaemon)
    assert plain.spec.start_args == ("-d",)
    assert plain.spec.resource == step.spec.resource  # same claim, same devices


def test_multi_user_on_a_gpu_older_than_volta_is_refused_naming_field_and_device() -> None:
    """NVIDIA's driver checks compute capability 7.0 for multi-user MPS; so does gpuslice,
    at Prepare, where the claim's error reaches the pod's events."""
    old = GPUS["gpu-0"]
    devs = {"gpu-0": replace(old, gpu=replace(old.gpu, compute_capability=(6, 0)))}
    with pytest.raises(ClaimError) as err:
        prepare(mps_claim(["gpu-0"], "GpuConfig", {"multiUser": True}), devs)
    assert "config[0]: mpsConfig.multiUser true needs a Volta or newer GPU" in str(err.value)
    assert "device gpu-0 has 6.0" in str(err.value)
    *_, step = prepare(mps_claim(["gpu-0"], "GpuConfig"), devs).steps  # without it: fine
    assert isinstance(step, StartDaemon)


UID = "0b8e1d7c-3a52-4f0e-9c1d-2e4f6a8b0c1d"


def test_the_record_keeps_a_mig_daemons_devices_and_mode_and_refuses_a_widened_one() -> None:
    applied = AppliedSharing(
        "MPS", ("GPU-a",), mps_key=f"{UID}-abcde", mig_uuids=("MIG-1", "MIG-2"), multi_user=True
    )
    cp = Checkpoint("boot", {UID: PreparedClaim(UID, "ns", "c", "PrepareCompleted",
                                                    applied=(applied,))})  # fmt: skip
    back = decode(encode(cp), "boot")
    assert back.status == "ok", back.reason
    assert back.checkpoint.claims[UID].applied == (applied,)
    plain = replace(applied, mig_uuids=(), multi_user=False)
    raw = encode(replace(cp, claims={UID: replace(cp.claims[UID], applied=(plain,))}))
    assert b"migDevices" not in raw  # a GPU's record reads as before
    assert b"multiUser" not in raw
    for bad in (["MIG-1,GPU-2"], "MIG-1", ["GPU-1"], [7]):
        data = {"bootID": "boot", "claims": {UID: {
            "namespace": "ns", "name": "c", "state": "PrepareCompleted",
            "applied": [{"strategy": "MPS", "gpus": ["GPU-a"], "migDevices": bad}]}}}  # fmt: skip
        got = decode(sealed(data), "boot")
        assert (got.status, "migDevices" in got.reason) == ("corrupt", True), bad
