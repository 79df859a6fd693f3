"""Which pod and container a process belongs to, read from its `/proc/<pid>/cgroup` text.

NVML reports GPU processes by host PID only. The kubelet puts every container in a cgroup
whose path names the pod UID and (below it) the container ID, so the cgroup path is the one
link from a PID to a pod that needs no container-runtime API. The path's shape depends on
the cgroup version, the kubelet's cgroup driver (systemd or cgroupfs), the runtime, the pod's
QoS class and, when the reader runs in its own cgroup namespace, how many `..` segments
lead back up to the pod's slice. This module accepts all of those and nothing else: a
process that is not in a pod (a host daemon, the MPS server, a plain Docker container)
gives None rather than a guess.

Forms accepted (one path segment each, anywhere in the path):

* systemd driver: `kubepods[-<qos>]-pod<uid_with_underscores>.slice`, also with the
  `kubelet-` prefix some distributions add; leaf `cri-containerd-<id>.scope`,
  `crio-<id>.scope` or `docker-<id>.scope`;
* cgroupfs driver: `pod<uid-with-dashes>` after an optional `kubepods/<qos>`; leaf `<id>`.

Static pods have a 32-hex-digit UID (a hash of the manifest) instead of a UUID; both are
accepted.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal, NewType

PodUid = NewType("PodUid", str)
"""`metadata.uid` of a pod, dashes as the API server writes it."""

ContainerId = NewType("ContainerId", str)
"""The runtime's container ID (64 hex digits), without the `containerd://` scheme."""

ContainerRuntime = Literal["containerd", "cri-o", "docker"]
QosClass = Literal["guaranteed", "burstable", "besteffort"]


@dataclass(frozen=True, slots=True)
class CgroupIdentity:
    """The pod (and, when the path goes that deep, the container) a process runs in."""

    pod_uid: PodUid
    container_id: ContainerId | None
    """None for a process in the pod's cgroup itself (or in a runtime helper like conmon)."""
    runtime: ContainerRuntime | None
    """Known from the systemd scope name; None for cgroupfs leaves, which carry no prefix."""
    qos: QosClass | None
    """None only when a cgroup namespace hides the QoS level from the reader."""


_UID = (
    r"(?P<uid>[0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12}"
    r"|[0-9a-f]{32})"
)
_SYSTEMD_POD = re.compile(
    r"^(?:kubelet-)?kubepods(?:-(?P<qos>burstable|besteffort))?-pod" + _UID + r"\.slice$"
)
_CGROUPFS_POD = re.compile(r"^pod" + _UID + r"$")
_SCOPE = re.compile(r"^(?P<prefix>cri-containerd|crio|docker)-(?P<id>[0-9a-f]{64})\.scope$")
_BARE_ID = re.compile(r"^[0-9a-f]{64}$")
_RUNTIMES: dict[str, ContainerRuntime] = {
    "cri-containerd": "containerd",
    "crio": "cri-o",
    "docker": "docker",
}
_QOS_SEGMENTS: dict[str, QosClass] = {
    "burstable": "burstable",
    "besteffort": "besteffort",
    "kubepods-burstable.slice": "burstable",
    "kubepods-besteffort.slice": "besteffort",
    "kubelet-kubepods-burstable.slice": "burstable",
    "kubelet-kubepods-besteffort.slice": "besteffort",
}
_KUBEPODS_SEGMENTS = frozenset({"kubepods", "kubepods.slice", "kubelet-kubepods.slice"})


def parse_cgroup(text: str) -> CgroupIdentity | None:
    """The pod identity in a `/proc/<pid>/cgroup` file (v1 or v2), or None if not in a pod.

    cgroup v1 lists one line per hierarchy; they normally agree, but some hierarchies (an
    unmounted `name=` one, `misc`) may sit at `/`, so the line that says most (a container
    ID, then at least a pod) wins.
    """
    best: CgroupIdentity | None = None
    for line in text.splitlines():
        parts = line.strip().split(":", 2)
        if len(parts) != 3:
            continue
        found = parse_cgroup_path(parts[2])
        if found is None:
            continue
        if found.container_id is not None:
            return found
        best = best or found
    return best


def parse_cgroup_path(path: str) -> CgroupIdentity | None:
    """The pod identity in one cgroup path, or None when no segment names a pod."""
    segments = [s for s in path.split("/") if s and s not in (".", "..")]
    for i, segment in enumerate(segments):
        systemd = _SYSTEMD_POD.match(segment)
        cgroupfs = None if systemd else _CGROUPFS_POD.match(segment)
        match = systemd or cgroupfs
        if match is None:
            continue
        uid = _normalise_uid(match.group("uid"))
        if systemd is not None:
            qos_name = systemd.group("qos")
            qos: QosClass | None = _qos(qos_name) if qos_name else "guaranteed"
        else:
            qos = _cgroupfs_qos(segments[:i])
        container_id, runtime = _container(segments[i + 1] if i + 1 < len(segments) else "")
        return CgroupIdentity(pod_uid=uid, container_id=container_id, runtime=runtime, qos=qos)
    return None


def _normalise_uid(raw: str) -> PodUid:
    return PodUid(raw.replace("_", "-"))


def _qos(name: str) -> QosClass:
    return "burstable" if name == "burstable" else "besteffort"


def _cgroupfs_qos(parents: list[str]) -> QosClass | None:
    """`kubepods/burstable/pod…` -> burstable; `kubepods/pod…` -> guaranteed.

    With nothing above the pod segment (a cgroup namespace rooted at or below the QoS
    level) the class cannot be told.
    """
    if not parents:
        return None
    last = parents[-1]
    if last in _QOS_SEGMENTS:
        return _QOS_SEGMENTS[last]
    if last in _KUBEPODS_SEGMENTS:
        return "guaranteed"
    return None


def _container(segment: str) -> tuple[ContainerId | None, ContainerRuntime | None]:
    scope = _SCOPE.match(segment)
    if scope is not None:
        return ContainerId(scope.group("id")), _RUNTIMES[scope.group("prefix")]
    if _BARE_ID.match(segment):
        return ContainerId(segment), None
    return None, None
