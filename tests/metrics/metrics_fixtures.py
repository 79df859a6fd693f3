"""Hand-built plans, fake /proc trees and a scripted GPU backend for the metrics tests.

The facts (cgroup path shapes, replica IDs, MPS limits) are the published ones, written
out here by hand rather than produced by the code under test.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from gpuslice.core.devices import Gpu, GpuUuid, Inventory, MigDevice, MigUuid
from gpuslice.core.health import HealthEvent
from gpuslice.core.sharing.model import (
    AdvertisedDevice,
    DeviceId,
    MpsShare,
    PhysicalDevice,
    Plan,
    ResourceName,
    ResourcePlan,
    SharingStrategy,
)
from gpuslice.core.units import MIB
from gpuslice.ports import GpuProcess, GpuStatus

T4 = GpuUuid("GPU-11111111-0000-0000-0000-000000000000")
A100_MPS = GpuUuid("GPU-22222222-0000-0000-0000-000000000000")
A100_MIG = GpuUuid("GPU-33333333-0000-0000-0000-000000000000")
L40S = GpuUuid("GPU-44444444-0000-0000-0000-000000000000")
MIG_1G = MigUuid("MIG-aaaaaaaa-0000-0000-0000-000000000000")
MIG_3G = MigUuid("MIG-bbbbbbbb-0000-0000-0000-000000000000")

SHARED = ResourceName("nvidia.com/gpu.shared")
MPS = ResourceName("nvidia.com/gpu.mps")
MIG_1G_RES = ResourceName("nvidia.com/mig-1g.10gb")
MIG_3G_RES = ResourceName("nvidia.com/mig-3g.40gb")
WHOLE = ResourceName("nvidia.com/gpu")

INVENTORY = Inventory(
    gpus=(
        Gpu(0, T4, "Tesla T4", 15360, 40, (7, 5), "00000000:01:00.0", 0),
        Gpu(1, A100_MPS, "NVIDIA A100-SXM4-80GB", 81920, 108, (8, 0), "00000000:02:00.0", 1),
        Gpu(
            2,
            A100_MIG,
            "NVIDIA A100-SXM4-80GB",
            81920,
            108,
            (8, 0),
            "00000000:03:00.0",
            2,
            mig_capable=True,
            mig_enabled=True,
            mig_devices=(
                MigDevice(MIG_1G, A100_MIG, 2, 0, "1g.10gb", 9, 0, 9856, 14, 1, 1, 6, 1),
                MigDevice(MIG_3G, A100_MIG, 2, 1, "3g.40gb", 2, 0, 40192, 42, 3, 3, 0, 4),
            ),
        ),
        Gpu(3, L40S, "NVIDIA L40S", 46068, 142, (8, 9), "00000000:04:00.0", 3),
    ),
    driver_version="550.54.15",
    cuda_driver_version=12040,
)


def _gpu_phys(gpu: Gpu) -> PhysicalDevice:
    return PhysicalDevice(
        gpu.uuid,
        gpu.index_id,
        gpu.uuid,
        gpu.index,
        "gpu",
        gpu.product_name,
        gpu.memory_mib,
        gpu.multiprocessors,
        gpu.minor,
    )


def _mig_phys(gpu: Gpu, mig: MigDevice) -> PhysicalDevice:
    return PhysicalDevice(
        mig.uuid,
        mig.index_id,
        gpu.uuid,
        gpu.index,
        "mig",
        gpu.product_name,
        mig.memory_mib,
        mig.multiprocessors,
        gpu.minor,
        profile=mig.profile,
        gi_id=mig.gi_id,
        ci_id=mig.ci_id,
    )


def _replicas(
    phys: PhysicalDevice, n: int, mps: MpsShare | None = None
) -> tuple[AdvertisedDevice, ...]:
    return tuple(AdvertisedDevice(DeviceId(f"{phys.uuid}::{i}"), phys, i, n, mps) for i in range(n))


def _resource(
    name: ResourceName, strategy: SharingStrategy, devices: tuple[AdvertisedDevice, ...]
) -> ResourcePlan:
    return ResourcePlan(name, name, strategy, True, devices)


def build_plan(inventory: Inventory = INVENTORY) -> Plan:
    """T4 time-sliced x4, A100 MPS x2 (50 %, 40960 MiB), A100 MIG 1g+3g, L40S whole."""
    t4, mps_gpu, mig_gpu, l40s = inventory.gpus
    mig_1g, mig_3g = mig_gpu.mig_devices
    return Plan(
        resources=(
            _resource(SHARED, SharingStrategy.TIME_SLICING, _replicas(_gpu_phys(t4), 4)),
            _resource(
                MPS, SharingStrategy.MPS, _replicas(_gpu_phys(mps_gpu), 2, MpsShare(50, 40960))
            ),
            _resource(
                MIG_1G_RES,
                SharingStrategy.NONE,
                (AdvertisedDevice(DeviceId(MIG_1G), _mig_phys(mig_gpu, mig_1g), None, 1),),
            ),
            _resource(
                MIG_3G_RES,
                SharingStrategy.NONE,
                (AdvertisedDevice(DeviceId(MIG_3G), _mig_phys(mig_gpu, mig_3g), None, 1),),
            ),
            _resource(
                WHOLE,
                SharingStrategy.NONE,
                (AdvertisedDevice(DeviceId(L40S), _gpu_phys(l40s), None, 1),),
            ),
        ),
        mig_strategy="mixed",
    )


def container_id(n: int) -> str:
    """A 64-hex container ID, distinct per n."""
    return f"{n:02x}" * 32


def uid(n: int) -> str:
    return f"{n:08x}-1111-4222-8333-{n:012x}"


# One function per cgroup form (REFERENCE Part 2 §6). Each returns the whole file text.
def v2_systemd_containerd(pod_uid: str, cid: str, qos: str = "burstable") -> str:
    u = pod_uid.replace("-", "_")
    if qos == "guaranteed":
        return f"0::/kubepods.slice/kubepods-pod{u}.slice/cri-containerd-{cid}.scope\n"
    return (
        f"0::/kubepods.slice/kubepods-{qos}.slice/kubepods-{qos}-pod{u}.slice/"
        f"cri-containerd-{cid}.scope\n"
    )


def v2_systemd_crio(pod_uid: str, cid: str) -> str:
    u = pod_uid.replace("-", "_")
    return f"0::/kubepods.slice/kubepods-pod{u}.slice/crio-{cid}.scope\n"


def v2_systemd_docker(pod_uid: str, cid: str) -> str:
    u = pod_uid.replace("-", "_")
    return (
        f"0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{u}.slice/"
        f"docker-{cid}.scope\n"
    )


def v1_cgroupfs(pod_uid: str, cid: str, qos: str = "burstable") -> str:
    mid = "" if qos == "guaranteed" else f"{qos}/"
    path = f"/kubepods/{mid}pod{pod_uid}/{cid}"
    return "\n".join(
        [
            "13:misc:/",
            f"12:memory:{path}",
            f"11:cpu,cpuacct:{path}",
            f"10:devices:{path}",
            "1:name=systemd:/",
            "",
        ]
    )


def kubelet_slice_prefix(pod_uid: str, cid: str) -> str:
    u = pod_uid.replace("-", "_")
    return (
        "0::/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-burstable.slice/"
        f"kubelet-kubepods-burstable-pod{u}.slice/cri-containerd-{cid}.scope\n"
    )


def namespaced_relative(pod_uid: str, cid: str) -> str:
    u = pod_uid.replace("-", "_")
    return (
        f"0::/../../kubepods-besteffort.slice/kubepods-besteffort-pod{u}.slice/"
        f"cri-containerd-{cid}.scope\n"
    )


HOST_DAEMON = "0::/system.slice/nvidia-mps.service\n"


def write_proc(root: Path, pid: int, cgroup_text: str) -> None:
    """One entry of a fake /proc tree: `<root>/<pid>/cgroup`."""
    d = root / str(pid)
    d.mkdir(parents=True, exist_ok=True)
    (d / "cgroup").write_text(cgroup_text)


def proc(
    pid: int, gpu: str, mib: int | None, *, mig: str | None = None, sm: int | None = None
) -> GpuProcess:
    return GpuProcess(
        pid=pid,
        gpu_uuid=gpu,
        used_memory_bytes=None if mib is None else mib * MIB,
        mig_uuid=mig,
        sm_util_percent=sm,
    )


@dataclass
class ScriptedBackend:
    """A GpuBackend whose telemetry and process list the test sets directly."""

    inv: Inventory = INVENTORY
    gpu_statuses: list[GpuStatus] = field(default_factory=list)
    gpu_processes: list[GpuProcess] = field(default_factory=list)
    fail_statuses: bool = False

    @property
    def name(self) -> str:
        return "scripted"

    def inventory(self) -> Inventory:
        return self.inv

    def wait_health_event(self, timeout_s: float) -> HealthEvent | None:
        return None

    def processes(self) -> tuple[GpuProcess, ...]:
        return tuple(self.gpu_processes)

    def statuses(self) -> tuple[GpuStatus, ...]:
        if self.fail_statuses:
            raise RuntimeError("NVML: GPU is lost")
        return tuple(self.gpu_statuses)

    def close(self) -> None:
        pass


def default_statuses() -> list[GpuStatus]:
    return [
        GpuStatus(T4, 3000, 12360, 55, 20, 61, 38.5),
        GpuStatus(A100_MPS, 20000, 61920, 70, 35, 50, 250.0),
        GpuStatus(A100_MIG, 5000, 76920, None, None, 45, 90.0, last_xid=31),
        GpuStatus(L40S, 0, 46068, 0, 0, 30, 35.0),
    ]
