"""Per-container attribution for time-slicing, MPS, MIG and whole GPUs.

Each test builds a fake /proc tree with the cgroup form a real node would show, reads it
through `metrics.procfs` and joins it with PodResources-shaped assignments and a plan.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from gpuslice.core.attribution import Attribution, ContainerGpuUsage, attribute
from gpuslice.core.cgroups import ContainerId, PodUid
from gpuslice.core.sharing.model import SharingStrategy
from gpuslice.core.units import MIB
from gpuslice.metrics.procfs import cgroup_identities
from gpuslice.ports import ContainerDevices, GpuProcess
from tests.metrics.metrics_fixtures import (
    A100_MIG,
    A100_MPS,
    HOST_DAEMON,
    INVENTORY,
    L40S,
    MIG_1G,
    MIG_1G_RES,
    MIG_3G,
    MIG_3G_RES,
    MPS,
    SHARED,
    T4,
    WHOLE,
    build_plan,
    container_id,
    kubelet_slice_prefix,
    namespaced_relative,
    proc,
    uid,
    v1_cgroupfs,
    v2_systemd_containerd,
    v2_systemd_crio,
    v2_systemd_docker,
    write_proc,
)

PLAN = build_plan()


def run(
    root: Path,
    assignments: list[ContainerDevices],
    processes: list[GpuProcess],
    pods: Mapping[PodUid, tuple[str, str]] | None = None,
    **kw: object,
) -> Attribution:
    identities = cgroup_identities([p.pid for p in processes], root)
    return attribute(assignments, PLAN, processes, identities, pods, **kw)  # type: ignore[arg-type]


def one(att: Attribution, namespace: str, pod: str) -> ContainerGpuUsage:
    (usage,) = att.for_pod(namespace, pod)
    return usage


def test_time_slicing_two_pods_with_uid_map(tmp_path: Path) -> None:
    write_proc(tmp_path, 101, v2_systemd_containerd(uid(1), container_id(1)))
    write_proc(tmp_path, 102, v2_systemd_containerd(uid(1), container_id(1)))
    write_proc(tmp_path, 201, v1_cgroupfs(uid(2), container_id(2)))
    att = run(
        tmp_path,
        [
            ContainerDevices("ml", "train", "main", SHARED, (f"{T4}::0",)),
            ContainerDevices("web", "infer", "srv", SHARED, (f"{T4}::2",)),
        ],
        [proc(101, T4, 1000, sm=20), proc(102, T4, 500, sm=5), proc(201, T4, 3000, sm=40)],
        {PodUid(uid(1)): ("ml", "train"), PodUid(uid(2)): ("web", "infer")},
    )
    train, infer = one(att, "ml", "train"), one(att, "web", "infer")
    assert (train.memory_used_bytes, train.sm_util_percent, train.pids) == (
        1500 * MIB,
        25,
        (101, 102),
    )
    assert (infer.memory_used_bytes, infer.sm_util_percent, infer.pids) == (3000 * MIB, 40, (201,))
    # A T4 has 15360 MiB; four replicas -> a fair share of 3840 MiB and a quarter of the SMs.
    assert train.entitlement.kind == "time-slicing"
    assert train.entitlement.memory_bytes == 3840 * MIB
    assert train.entitlement.sm_fraction == 0.25
    assert (train.gpu_index, train.gpu_uuid) == (0, T4)
    assert att.unattributed == ()


def test_time_slicing_without_uid_map_shared_gpu_is_ambiguous(tmp_path: Path) -> None:
    write_proc(tmp_path, 101, kubelet_slice_prefix(uid(1), container_id(1)))
    write_proc(tmp_path, 201, namespaced_relative(uid(2), container_id(2)))
    att = run(
        tmp_path,
        [
            ContainerDevices("ml", "train", "main", SHARED, (f"{T4}::0",)),
            ContainerDevices("web", "infer", "srv", SHARED, (f"{T4}::1",)),
        ],
        [proc(101, T4, 1000), proc(201, T4, 3000)],
    )
    assert {(p.pid, p.reason) for p in att.unattributed} == {(101, "ambiguous"), (201, "ambiguous")}
    assert all(u.memory_used_bytes == 0 and u.pids == () for u in att.usages)
    # The holders are still listed with their entitlement: usage zero, not absent.
    assert {(u.namespace, u.pod) for u in att.usages} == {("ml", "train"), ("web", "infer")}


def test_sole_holder_rule_and_learned_uid_carry_to_a_shared_gpu(tmp_path: Path) -> None:
    # Pod "train" holds the L40S alone and a T4 replica shared with "infer".
    write_proc(tmp_path, 101, v2_systemd_crio(uid(1), container_id(1)))
    write_proc(tmp_path, 102, v2_systemd_crio(uid(1), container_id(1)))
    write_proc(tmp_path, 201, v2_systemd_docker(uid(2), container_id(2)))
    att = run(
        tmp_path,
        [
            ContainerDevices("ml", "train", "main", WHOLE, (L40S,)),
            ContainerDevices("ml", "train", "main", SHARED, (f"{T4}::3",)),
            ContainerDevices("web", "infer", "srv", SHARED, (f"{T4}::1",)),
        ],
        [proc(101, L40S, 2000), proc(102, T4, 700), proc(201, T4, 900)],
    )
    assert att.learned_pods == {uid(1): ("ml", "train")}
    whole = next(u for u in att.usages if u.gpu_uuid == L40S)
    shared = next(u for u in att.usages if u.gpu_uuid == T4 and u.pod == "train")
    assert (whole.memory_used_bytes, whole.entitlement.kind) == (2000 * MIB, SharingStrategy.NONE)
    assert whole.entitlement.memory_bytes == 46068 * MIB
    assert whole.entitlement.sm_fraction == 1.0
    assert shared.memory_used_bytes == 700 * MIB
    # "infer" runs only on the shared T4: nothing identifies it without a UID map.
    assert [(p.pid, p.reason) for p in att.unattributed] == [(201, "ambiguous")]


def test_sole_holder_with_an_intruder_attributes_nobody(tmp_path: Path) -> None:
    write_proc(tmp_path, 101, v2_systemd_containerd(uid(1), container_id(1)))
    write_proc(tmp_path, 901, v2_systemd_containerd(uid(9), container_id(9)))
    att = run(
        tmp_path,
        [ContainerDevices("ml", "train", "main", WHOLE, (L40S,))],
        [proc(101, L40S, 100), proc(901, L40S, 100)],
    )
    assert {p.reason for p in att.unattributed} == {"ambiguous"}
    assert one(att, "ml", "train").memory_used_bytes == 0


def test_mps_entitlement_is_the_pinned_limit_and_thread_share(tmp_path: Path) -> None:
    write_proc(tmp_path, 301, v2_systemd_containerd(uid(3), container_id(3), "guaranteed"))
    write_proc(tmp_path, 50, HOST_DAEMON)  # the MPS server itself
    att = run(
        tmp_path,
        [ContainerDevices("ml", "mps-job", "main", MPS, (f"{A100_MPS}::1",))],
        [proc(301, A100_MPS, 30000, sm=35), proc(50, A100_MPS, 500)],
        {PodUid(uid(3)): ("ml", "mps-job")},
    )
    job = one(att, "ml", "mps-job")
    assert job.entitlement.kind == "mps"
    assert job.entitlement.memory_bytes == 40960 * MIB
    assert job.entitlement.sm_fraction == 0.5
    assert (job.memory_used_bytes, job.sm_util_percent) == (30000 * MIB, 35)
    assert [(p.pid, p.reason) for p in att.unattributed] == [(50, "not-in-a-pod")]


def test_mig_devices_by_instance(tmp_path: Path) -> None:
    write_proc(tmp_path, 401, v1_cgroupfs(uid(4), container_id(4), "besteffort"))
    write_proc(tmp_path, 501, v2_systemd_containerd(uid(5), container_id(5)))
    assignments = [
        ContainerDevices("a", "small", "c", MIG_1G_RES, (MIG_1G,)),
        ContainerDevices("b", "large", "c", MIG_3G_RES, (MIG_3G,)),
    ]
    procs = [proc(401, A100_MIG, 4000, mig=MIG_1G), proc(501, A100_MIG, 20000, mig=MIG_3G)]
    # No UID map: each MIG device has one holder, so the sole-holder rule applies per instance.
    att = run(tmp_path, assignments, procs, inventory=INVENTORY)
    small, large = one(att, "a", "small"), one(att, "b", "large")
    assert (small.memory_used_bytes, large.memory_used_bytes) == (4000 * MIB, 20000 * MIB)
    assert small.entitlement.kind == "mig"
    assert small.entitlement.memory_bytes == 9856 * MIB
    assert small.entitlement.sm_fraction == 14 / 108
    assert large.entitlement.sm_fraction == 42 / 108
    assert small.sm_util_percent is None  # NVML gives no per-process samples under MIG
    assert small.physical_uuids == (MIG_1G,)
    assert (small.gpu_uuid, small.gpu_index) == (A100_MIG, 2)
    # Without the inventory the parent's SM count is unknown (no whole-GPU entry for it).
    bare = run(tmp_path, assignments, procs)
    assert one(bare, "a", "small").entitlement.sm_fraction is None


def test_process_of_a_pod_that_holds_no_device_on_that_gpu(tmp_path: Path) -> None:
    write_proc(tmp_path, 101, v2_systemd_containerd(uid(1), container_id(1)))
    att = run(
        tmp_path,
        [ContainerDevices("ml", "train", "main", SHARED, (f"{T4}::0",))],
        [proc(101, L40S, 100)],
        {PodUid(uid(1)): ("ml", "train")},
    )
    assert [(p.pid, p.reason) for p in att.unattributed] == [(101, "no-holder")]


def test_two_containers_of_one_pod_on_one_gpu(tmp_path: Path) -> None:
    write_proc(tmp_path, 101, v2_systemd_containerd(uid(1), container_id(1)))
    write_proc(tmp_path, 102, v2_systemd_containerd(uid(1), container_id(2)))
    assignments = [
        ContainerDevices("ml", "train", "main", SHARED, (f"{T4}::0",)),
        ContainerDevices("ml", "train", "helper", SHARED, (f"{T4}::1",)),
    ]
    procs = [proc(101, T4, 1000), proc(102, T4, 200)]
    pods = {PodUid(uid(1)): ("ml", "train")}
    att = run(tmp_path, assignments, procs, pods)
    assert {p.reason for p in att.unattributed} == {"ambiguous"}
    names = {ContainerId(container_id(1)): "main", ContainerId(container_id(2)): "helper"}
    att = run(tmp_path, assignments, procs, pods, container_names=names)
    by_container = {u.container: u.memory_used_bytes for u in att.usages}
    assert by_container == {"main": 1000 * MIB, "helper": 200 * MIB}


def test_two_replicas_in_one_container_add_up(tmp_path: Path) -> None:
    att = run(
        tmp_path,
        [ContainerDevices("ml", "big", "main", SHARED, (f"{T4}::0", f"{T4}::1"))],
        [],
    )
    big = one(att, "ml", "big")
    assert big.entitlement.memory_bytes == 2 * 3840 * MIB
    assert big.entitlement.sm_fraction == 0.5
    assert big.device_ids == (f"{T4}::0", f"{T4}::1")
    assert (big.memory_used_bytes, big.sm_util_percent) == (0, 0.0)


def test_device_ids_the_plan_does_not_know_are_reported(tmp_path: Path) -> None:
    att = run(
        tmp_path,
        [
            ContainerDevices("ml", "old", "main", SHARED, (f"{T4}::7",)),
            ContainerDevices("net", "nic", "main", "example.com/rdma", ("rdma0",)),
        ],
        [],
    )
    assert att.usages == ()
    assert set(att.unknown_device_ids) == {f"{T4}::7", "rdma0"}


def test_process_with_unknown_memory_counts_as_zero_and_missing_samples(tmp_path: Path) -> None:
    write_proc(tmp_path, 101, v2_systemd_containerd(uid(1), container_id(1)))
    att = run(
        tmp_path,
        [ContainerDevices("ml", "train", "main", WHOLE, (L40S,))],
        [proc(101, L40S, None)],
    )
    usage = one(att, "ml", "train")
    assert (usage.memory_used_bytes, usage.pids, usage.sm_util_percent) == (0, (101,), None)
