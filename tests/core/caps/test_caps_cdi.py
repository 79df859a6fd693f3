"""Caps in the DRA claim specs: the env the toolkit's hook reads and the hook itself,
only for capped devices, only when one pair of limits serves the claim."""

from __future__ import annotations

from gpuslice.core.caps import GpuCapability, MemoryLimits, Refusal
from gpuslice.core.cdi.hook import CdiCaps, hook_limits
from gpuslice.core.cdi.spec import CdiDevice
from gpuslice.core.devices import Gpu, GpuUuid
from gpuslice.core.dra.caps import claim_limits, use_limits
from gpuslice.core.dra.cdispec import claim_spec
from gpuslice.core.dra.prepared import DeviceUse
from gpuslice.core.sharing.model import PhysicalDevice, SharingStrategy
from gpuslice.core.units import MIB
from gpuslice.testing.cdirun import Container

TS = SharingStrategy.TIME_SLICING

CAPS = CdiCaps("/usr/bin/nvidia-cdi-hook")
CAPABLE = GpuCapability("GPU-a")
L40S = 46068


def physical(memory_mib: int = L40S, uuid: str = "GPU-a") -> PhysicalDevice:
    gpu = Gpu(
        index=0, uuid=GpuUuid(uuid), product_name="NVIDIA L40S", memory_mib=memory_mib,
        multiprocessors=142, compute_capability=(8, 9), pci_bus_id="00000000:07:00.0", minor=0,
    )  # fmt: skip
    return PhysicalDevice.of_gpu(gpu)


def test_a_share_is_capped_at_its_consumed_memory() -> None:
    use = DeviceUse("gpu-0", "GPU-a", TS, 4, share_id="s1", entitlement_mib=8192)
    got = use_limits(use, physical(), CAPABLE, "strict")
    assert got == MemoryLimits(8192 * MIB, 8192 * MIB)
    assert use_limits(use, physical(), CAPABLE, "borrow") == MemoryLimits(8192 * MIB, L40S * MIB)


def test_a_claim_shared_by_pods_is_capped_at_its_part() -> None:
    use = DeviceUse("gpu-0", "GPU-a", TS, 4)
    assert use_limits(use, physical(), CAPABLE, "strict") == MemoryLimits(
        L40S * MIB // 4, L40S * MIB // 4
    )


def test_no_cap_for_mps_exclusive_admin_or_incapable_gpus() -> None:
    p = physical()
    mps = DeviceUse(
        "gpu-0", "GPU-a", SharingStrategy.MPS, 2, entitlement_mib=4096, thread_percentage=50
    )
    alone = DeviceUse("gpu-0", "GPU-a", SharingStrategy.NONE, 1)
    admin = DeviceUse("gpu-0", "GPU-a", TS, 4, admin=True)
    shared = DeviceUse("gpu-0", "GPU-a", TS, 4)
    assert use_limits(mps, p, CAPABLE, "strict") is None
    assert use_limits(alone, p, CAPABLE, "strict") is None
    assert use_limits(admin, p, CAPABLE, "strict") is None
    refusals: tuple[Refusal, ...] = ("mig", "driver-without-call", "cgroup-v1", "caps-off")
    for refusal in refusals:
        refused = GpuCapability("GPU-a", refusal)
        assert use_limits(shared, p, refused, "strict") is None
    assert use_limits(shared, p, None, "strict") is None


def test_claim_limits_skips_devices_not_in_the_inventory() -> None:
    uses = [
        DeviceUse("gpu-0", "GPU-a", TS, 2),
        DeviceUse("gpu-9", "GPU-gone", TS, 2),
    ]
    got = claim_limits(uses, {"GPU-a": physical()}, {"GPU-a": CAPABLE}, "strict")
    assert set(got) == {"gpu-0"}


def capped(name: str, uuid: str, limits: MemoryLimits | None, minor: int = 0) -> CdiDevice:
    return CdiDevice(name, uuid, minor, request="r", memory_limits=limits)


def test_the_spec_carries_env_and_hook_per_capped_device() -> None:
    lim = MemoryLimits(11517 * MIB, 11517 * MIB)
    spec = claim_spec(
        "uid-1",
        [capped("gpu-0", "GPU-a", lim), capped("gpu-1", "GPU-b", lim, 1)],
        caps=CdiCaps("/opt/nvidia/nvidia-cdi-hook", "/run/nvidia/driver"),
    )
    c = Container()
    hooks = []
    for dev in spec["devices"]:
        c.apply(dev["containerEdits"])
        hooks += dev["containerEdits"]["hooks"]
    assert c.env["NVIDIA_GPU_MEMORY_REQUEST"] == "11517"
    assert c.env["NVIDIA_GPU_MEMORY_LIMIT"] == "11517"
    assert [h["hookName"] for h in hooks] == ["createRuntime", "createRuntime"]
    assert [h["path"] for h in hooks] == ["/opt/nvidia/nvidia-cdi-hook"] * 2
    assert [h["args"][-1] for h in hooks] == ["GPU-a", "GPU-b"]
    assert hooks[0]["args"][:4] == [
        "nvidia-cdi-hook", "apply-cuda-memory-limits", "--driver-root", "/run/nvidia/driver"
    ]  # fmt: skip


def test_no_hook_without_caps_or_with_different_pairs() -> None:
    a = MemoryLimits(4096 * MIB, 4096 * MIB)
    b = MemoryLimits(8192 * MIB, 8192 * MIB)
    for spec in (
        claim_spec("uid-1", [capped("gpu-0", "GPU-a", a)]),  # caps None: an unable node
        claim_spec(
            "uid-1", [capped("gpu-0", "GPU-a", a), capped("gpu-1", "GPU-b", b, 1)], caps=CAPS
        ),
        claim_spec("uid-1", [capped("gpu-0", "GPU-a", None)], caps=CAPS),
    ):
        for dev in spec["devices"]:
            edits = dev["containerEdits"]
            assert "hooks" not in edits
            assert not any(e.startswith("NVIDIA_GPU_MEMORY_") for e in edits["env"])
    assert hook_limits({"x": a, "y": b}) is None
    assert hook_limits({}) is None


def test_an_uncapped_device_beside_a_capped_one_gets_no_hook() -> None:
    a = MemoryLimits(4096 * MIB, 4096 * MIB)
    spec = claim_spec(
        "uid-1", [capped("gpu-0", "GPU-a", a), capped("gpu-1", "GPU-b", None, 1)], caps=CAPS
    )
    first, second = (d["containerEdits"] for d in spec["devices"])
    assert "hooks" in first
    assert "hooks" not in second


def test_with_limits_puts_each_devices_caps_on_it() -> None:
    from gpuslice.core.cdi.spec import with_limits

    lim = MemoryLimits(4096 * MIB, 4096 * MIB)
    devs = with_limits([capped("gpu-0", "GPU-a", None), capped("gpu-1", "GPU-b", None, 1)],
                       {"gpu-1": lim})  # fmt: skip
    assert [d.memory_limits for d in devs] == [None, lim]


def test_limits_the_hook_would_refuse_give_no_hook_and_no_error() -> None:
    """A request above the limit fails the toolkit's hook, which fails the container: the
    spec then carries neither the hook nor the variables, and Prepare does not fail."""
    bad = MemoryLimits(8192 * MIB, 4096 * MIB)
    spec = claim_spec("uid-1", [capped("gpu-0", "GPU-a", bad)], caps=CAPS)
    [dev] = spec["devices"]
    assert "hooks" not in dev["containerEdits"]
    assert not any(e.startswith("NVIDIA_GPU_MEMORY_") for e in dev["containerEdits"]["env"])
