"""`/proc/<pid>/cgroup` -> pod identity, for every form the kubelet and runtimes produce."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuslice.core.cgroups import (
    CgroupIdentity,
    ContainerId,
    ContainerRuntime,
    PodUid,
    QosClass,
    parse_cgroup,
)
from gpuslice.metrics.procfs import cgroup_identities
from tests.metrics.metrics_fixtures import (
    HOST_DAEMON,
    container_id,
    kubelet_slice_prefix,
    namespaced_relative,
    uid,
    v1_cgroupfs,
    v2_systemd_containerd,
    v2_systemd_crio,
    v2_systemd_docker,
    write_proc,
)

UID = "0f9e8d7c-6b5a-4938-8271-605f4e3d2c1b"
CID = "a" * 40 + "0123456789abcdef01234567"


def ident(
    runtime: ContainerRuntime | None, qos: QosClass | None, cid: str | None = CID
) -> CgroupIdentity:
    return CgroupIdentity(PodUid(UID), ContainerId(cid) if cid else None, runtime, qos)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param(
            v2_systemd_containerd(UID, CID),
            ident("containerd", "burstable"),
            id="v2-systemd-containerd-burstable",
        ),
        pytest.param(
            v2_systemd_containerd(UID, CID, "guaranteed"),
            ident("containerd", "guaranteed"),
            id="v2-systemd-containerd-guaranteed",
        ),
        pytest.param(
            v2_systemd_containerd(UID, CID, "besteffort"),
            ident("containerd", "besteffort"),
            id="v2-systemd-containerd-besteffort",
        ),
        pytest.param(v2_systemd_crio(UID, CID), ident("cri-o", "guaranteed"), id="v2-systemd-crio"),
        pytest.param(
            v2_systemd_docker(UID, CID), ident("docker", "besteffort"), id="v2-systemd-docker"
        ),
        pytest.param(v1_cgroupfs(UID, CID), ident(None, "burstable"), id="v1-cgroupfs-burstable"),
        pytest.param(
            v1_cgroupfs(UID, CID, "besteffort"),
            ident(None, "besteffort"),
            id="v1-cgroupfs-besteffort",
        ),
        pytest.param(
            v1_cgroupfs(UID, CID, "guaranteed"),
            ident(None, "guaranteed"),
            id="v1-cgroupfs-guaranteed",
        ),
        pytest.param(
            f"0::/kubepods/burstable/pod{UID}/{CID}\n", ident(None, "burstable"), id="v2-cgroupfs"
        ),
        pytest.param(
            kubelet_slice_prefix(UID, CID),
            ident("containerd", "burstable"),
            id="kubelet-slice-prefix",
        ),
        pytest.param(
            namespaced_relative(UID, CID), ident("containerd", "besteffort"), id="cgroupns-relative"
        ),
        pytest.param(
            f"0::/../../pod{UID}/{CID}\n", ident(None, None), id="cgroupns-relative-cgroupfs-no-qos"
        ),
        pytest.param(
            "12:memory:/kubepods/burstable/pod" + UID + "\n",
            ident(None, "burstable", None),
            id="pod-level-only",
        ),
        pytest.param(
            "0::/kubepods.slice/kubepods-pod"
            + UID.replace("-", "_")
            + ".slice/crio-conmon-"
            + CID
            + ".scope\n",
            ident(None, "guaranteed", None),
            id="crio-conmon-is-not-a-container",
        ),
        pytest.param(
            "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod"
            + UID.replace("-", "_")
            + ".slice/cri-containerd-"
            + CID
            + ".scope/init.scope\n",
            ident("containerd", "burstable"),
            id="nested-below-container-scope",
        ),
    ],
)
def test_pod_forms(text: str, expected: CgroupIdentity) -> None:
    assert parse_cgroup(text) == expected


def test_static_pod_uid_without_dashes() -> None:
    static = "5d41402abc4b2a76b9719d911017c592"
    text = (
        "0::/kubepods.slice/kubepods-burstable.slice/"
        f"kubepods-burstable-pod{static}.slice/cri-containerd-{CID}.scope\n"
    )
    got = parse_cgroup(text)
    assert got is not None
    assert got.pod_uid == static


@pytest.mark.parametrize(
    "text",
    [
        pytest.param(HOST_DAEMON, id="host-service"),
        pytest.param("0::/user.slice/user-1000.slice/session-3.scope\n", id="user-session"),
        pytest.param(f"0::/system.slice/docker-{CID}.scope\n", id="plain-docker-container"),
        pytest.param(f"12:memory:/docker/{CID}\n1:name=systemd:/docker/{CID}\n", id="docker-v1"),
        pytest.param("0::/\n", id="root"),
        pytest.param("", id="empty"),
        pytest.param("not a cgroup file\n", id="garbage"),
        pytest.param(
            "0::/kubepods.slice/kubepods-podnot_a_uid.slice/cri-containerd-x.scope\n", id="bad-uid"
        ),
        pytest.param("0::/kubepods.slice/kubepods-burstable.slice\n", id="qos-slice-only"),
    ],
)
def test_non_pod_processes(text: str) -> None:
    assert parse_cgroup(text) is None


def test_procfs_reads_only_pod_processes_and_skips_vanished_pids(tmp_path: Path) -> None:
    write_proc(tmp_path, 100, v2_systemd_containerd(uid(1), container_id(1)))
    write_proc(tmp_path, 200, HOST_DAEMON)
    write_proc(tmp_path, 300, v1_cgroupfs(uid(3), container_id(3)))
    got = cgroup_identities([100, 200, 300, 400], tmp_path)
    assert set(got) == {100, 300}
    assert got[100].pod_uid == uid(1)
    assert got[100].container_id == container_id(1)
    assert got[300].pod_uid == uid(3)
