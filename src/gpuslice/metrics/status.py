"""`/status`: what the daemon knows, as JSON, for `gpuslice top` and for people with curl.

`top` used to rebuild this in its own process from its own config file and guessed wrong;
reading the daemon's own view is the only way it shows what the daemon enforces. Built from
the same snapshot `/metrics` serves, so the two never disagree.
"""

from __future__ import annotations

from gpuslice import __version__
from gpuslice.core.caps import LIMIT_MAX, CapsView
from gpuslice.core.dra.claimplan import CLAIM_PREFIX
from gpuslice.core.guard.model import ContainerKey
from gpuslice.core.jsontypes import Json
from gpuslice.core.sharing.model import Plan
from gpuslice.metrics.snapshot import MetricsSnapshot

STATUS_VERSION = 1
ASSIGNMENTS_PROBLEM = "pod assignments unavailable"


def _resources(plan: Plan | None) -> list[Json]:
    out: list[Json] = []
    for res in () if plan is None else plan.resources:
        replicas: dict[str, Json] = {}
        for dev in res.devices:
            entry = replicas.setdefault(
                dev.physical.uuid,
                {
                    "physical_uuid": dev.physical.uuid,
                    "gpu_index": dev.physical.gpu_index,
                    "product": dev.physical.product_name,
                    "memory_mib": dev.physical.memory_mib,
                    "replicas": dev.replicas,
                    "devices": 0,
                },
            )
            entry["devices"] += 1
            if dev.entitlement_mib is not None:
                # A DRA share: what the scheduler gave this claim, not memory / replicas.
                entry["entitlement_mib"] = entry.get("entitlement_mib", 0) + dev.entitlement_mib
            if dev.mps is not None:
                entry["mps_active_thread_percentage"] = dev.mps.active_thread_percentage
                entry["mps_pinned_memory_limit_mib"] = dev.mps.pinned_memory_limit_mib
        out.append(
            {
                "name": res.name,
                "strategy": str(res.strategy),
                "devices": len(res.devices),
                "per_gpu": list(replicas.values()),
            }
        )
    return out


def build_status(
    *,
    node_name: str,
    config_name: str | None,
    plan: Plan | None,
    snapshot: MetricsSnapshot | None,
    gpu_metrics: bool,
    pod_resources_socket: str,
    pod_resources_present: bool,
    ready: tuple[bool, str],
    caps: CapsView | None = None,
    mps_daemons: list[Json] | None = None,
) -> Json:
    """The JSON document of `/status` (version 1; fields are only ever added).

    `mps_daemons` (`resource`, `state`: ready|starting|down, `problem`): a daemon that is
    down is also a warning, so an agent that cannot run MPS (no privilege, no driver) does
    not look like one serving it."""
    pods: list[Json] = []
    gpus: list[Json] = []
    unattributed: list[Json] = []
    problems: list[str] = []
    if snapshot is not None:
        problems = list(snapshot.problems)
        gpus = [
            {
                "index": g.index,
                "uuid": g.uuid,
                "model": g.model,
                "memory_total_mib": g.memory_total_mib,
                "memory_used_mib": g.status.memory_used_mib,
                "gpu_util_percent": g.status.gpu_util_percent,
                "temperature_c": g.status.temperature_c,
                "power_w": g.status.power_w,
                "last_xid": g.status.last_xid,
                "memory_protection": None
                if caps is None or g.uuid not in caps.protection
                else caps.protection[g.uuid][0],
                "memory_protection_reason": None
                if caps is None or g.uuid not in caps.protection
                else caps.protection[g.uuid][1] or None,
            }
            for g in snapshot.gpus
        ]
        for u in snapshot.attribution.usages:
            ent = u.entitlement
            share = None if ent.memory_bytes <= 0 else u.memory_used_bytes / ent.memory_bytes
            cap = None
            waiting = None
            if caps is not None:
                pair = (ContainerKey(u.namespace, u.pod, u.container), u.gpu_uuid)
                cap = caps.limits.get(pair)
                waiting = caps.pending.get(pair)
            pods.append(
                {
                    "namespace": u.namespace,
                    "pod": u.pod,
                    "container": u.container,
                    "gpu_index": u.gpu_index,
                    "gpu_uuid": u.gpu_uuid,
                    "resources": list(u.resources),
                    "claims": [
                        r.removeprefix(CLAIM_PREFIX)
                        for r in u.resources
                        if r.startswith(CLAIM_PREFIX)
                    ],
                    "sharing": ent.kind.entitlement_kind,
                    "memory_used_bytes": u.memory_used_bytes,
                    "memory_entitled_bytes": ent.memory_bytes,
                    "memory_share_used": share,
                    "over_share": share is not None and share > 1.0,
                    "sm_util_percent": u.sm_util_percent,
                    "sm_share": ent.sm_fraction,
                    "pids": list(u.pids),
                    "memory_soft_limit_bytes": None if cap is None else cap.soft_bytes,
                    "memory_hard_limit_bytes": None
                    if cap is None or cap.hard_bytes == LIMIT_MAX
                    else cap.hard_bytes,
                    # Only limits read back count: a container is capped once the driver
                    # returned its limits, and one that should be and is not says why.
                    "memory_capped": cap is not None,
                    "memory_capped_used_bytes": None if cap is None else cap.used_bytes,
                    "memory_caps_reason": waiting,
                }
            )
        unattributed = [
            {"pid": p.pid, "gpu_uuid": p.gpu_uuid, "reason": p.reason}
            for p in snapshot.attribution.unattributed
        ]
    if not pod_resources_present:
        pod_resources = {"state": "missing", "detail": f"no socket at {pod_resources_socket}"}
    elif any(p.startswith(ASSIGNMENTS_PROBLEM) for p in problems):
        detail = next(p for p in problems if p.startswith(ASSIGNMENTS_PROBLEM))
        pod_resources = {"state": "unreachable", "detail": detail}
    else:
        pod_resources = {"state": "ok", "detail": pod_resources_socket}
    return {
        "version": STATUS_VERSION,
        "agent_version": __version__,
        "node_name": node_name,
        "config_name": config_name,
        "ready": ready[0],
        "ready_reason": ready[1].strip(),
        "gpu_metrics": gpu_metrics,
        "snapshot_taken_at": None if snapshot is None else snapshot.taken_at,
        "resources": _resources(plan),
        "gpus": gpus,
        "advertised": {} if snapshot is None else dict(snapshot.advertised),
        "allocated": {} if snapshot is None else dict(snapshot.allocated),
        "pods": sorted(pods, key=lambda p: (p["gpu_index"], p["namespace"], p["pod"])),
        "unattributed": unattributed,
        "pod_resources": pod_resources,
        "mps_daemons": list(mps_daemons or []),
        "warnings": problems
        + [
            f"MPS daemon for {d['resource']} is down, its replicas Unhealthy: {d['problem']}"
            for d in mps_daemons or []
            if d["state"] == "down"
        ],
    }
