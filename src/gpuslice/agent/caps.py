"""The agent's side of memory caps: find what the node allows, and hold every shared
container's cgroup to its limits where no CDI hook did it before the container ran.

Each round (the guard's poll, off the event loop: NVML and the cgroup filesystem block):
the containers that should be capped (`core.protection`: who holds what, from the
kubelet's PodResources and the plan, and each container's part of its holder's limits)
are looked up in the cgroup filesystem by pod UID and container ID (the pod watch gives
both as soon as the container has started); each one's limits are read back with
`nvmlDeviceGetMemoryLimits_v1` and set (or repaired) when missing or different, then read
again. The *window*, from the container's cgroup being created (its directory's
timestamp) to its limits being confirmed, is measured: it is the time a
workload ran uncapped, which a CDI hook makes zero.

A refusal the driver states (no such call, MIG) takes the GPU out of caps for the agent's
life, logged once with its reason. Any other NVML error on a GPU is retried with back-off
(`core.backoff`): until a retry confirms its limits again, the GPU reports the error and
its containers stay in the guard's view. A container that is gone (no cgroup, NVML's
NOT_FOUND) is forgotten quietly: removing a cgroup clears its limits. Nothing here can
refuse a pod: the worst a failure does is leave a GPU to the guard.

What is reported is only what was read back: a GPU is `capped` once its limits were
confirmed there and no container on it is waiting (`core.caps.gpu_protection`), and each
waiting container carries its reason (its cgroup not under `--cgroup-root`, NVML failing).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from gpuslice.core.backoff import Backoff
from gpuslice.core.caps import (
    REFUSAL_TEXT,
    CapPolicy,
    CapsMode,
    GpuCapability,
    GpuCaps,
    MemoryLimits,
    NodeCapability,
    Refusal,
    cgroup_candidates,
    check_outcome,
    gpu_capability,
)
from gpuslice.core.cdi.hook import CdiCaps
from gpuslice.core.cgroups import parse_cgroup
from gpuslice.core.devices import Inventory
from gpuslice.core.guard.model import ContainerKey
from gpuslice.core.protection import node_protection
from gpuslice.core.sharing.model import Plan
from gpuslice.logs import get_logger
from gpuslice.podresources import PodResourcesError
from gpuslice.ports import MemoryLimiter, MemoryLimitsError, PodAssignments

log = get_logger(__name__)

CGROUP_ROOT = Path("/sys/fs/cgroup")


POD_CGROUP_TOPS = ("kubepods.slice", "kubepods", "kubelet.slice/kubelet-kubepods.slice")
"""Where the kubelet roots its pods' cgroups under the cgroup root (systemd driver,
cgroupfs driver, the kubelet's own slice): the prefixes `core.caps.cgroup_candidates`
searches under."""

CAP_SYS_ADMIN = 21


def has_sys_admin(status: Path = Path("/proc/self/status")) -> bool:
    """Whether CAP_SYS_ADMIN is in the effective set (`CapEff`). A container running as UID
    0 with its capabilities dropped (the chart's default) is root to the file system but not
    to the driver, whose privileged calls check the capability."""
    try:
        text = status.read_text(encoding="ascii", errors="replace")
    except OSError:
        return False
    for line in text.splitlines():
        if line.startswith("CapEff:"):
            try:
                return bool(int(line.split(":", 1)[1].strip(), 16) >> CAP_SYS_ADMIN & 1)
            except ValueError:
                return False
    return False


def node_capability(
    cgroup_root: Path = CGROUP_ROOT, *, euid: int | None = None, admin: bool | None = None
) -> NodeCapability:
    """cgroup v2 is the unified hierarchy, whose root has `cgroup.controllers` (v1 has a
    directory per controller and no such file); root is the effective UID 0 with
    CAP_SYS_ADMIN. The pods' cgroups must be under the root: in a pod that did not mount the
    host's tree there, `/sys/fs/cgroup` is the pod's own cgroup namespace, a cgroup v2 tree
    with no other pod in it, where every container would be looked for in vain."""
    v2 = (cgroup_root / "cgroup.controllers").is_file()
    uid0 = (os.geteuid() if euid is None else euid) == 0
    admin = has_sys_admin() if admin is None else admin
    pods = any((cgroup_root / top).is_dir() for top in POD_CGROUP_TOPS)
    return NodeCapability(cgroup_v2=v2, root=uid0 and admin, pod_cgroups=pods)


def gpu_capabilities(
    inventory: Inventory,
    limiter: MemoryLimiter | None,
    node: NodeCapability,
    mode: CapsMode,
) -> dict[str, GpuCapability]:
    """Each GPU's capability, once at start; each refusal logged once (`caps-unavailable`)."""
    has_call = False
    if limiter is not None and mode != "off":
        try:
            has_call = limiter.memory_limits_supported()
        except Exception as exc:  # a probe must never stop the agent
            log.warning("caps-probe-failed", error=str(exc))
    out: dict[str, GpuCapability] = {}
    for gpu in inventory.gpus:
        cap = gpu_capability(
            gpu.uuid,
            mode=mode,
            mig_enabled=gpu.mig_enabled,
            memory_reported=gpu.memory_reported,
            driver_has_call=has_call,
            node=node,
        )
        out[gpu.uuid] = cap
        if cap.refusal not in (None, "caps-off"):
            log.info("caps-unavailable", gpu=gpu.uuid, refusal=cap.refusal, reason=cap.reason)
    return out


def resolve_cgroup(cgroup_root: Path, pod_uid: str, container_id: str) -> str | None:
    """The container's cgroup as NVML's `nameSpace` (the full sysfs path), or None."""
    for rel in cgroup_candidates(pod_uid, container_id):
        path = cgroup_root / rel
        if path.is_dir():
            return str(path)
    return None


@dataclass(frozen=True, slots=True)
class CapsRound:
    """What one round did, for logs and tests."""

    set: int = 0
    repaired: int = 0
    raised: int = 0
    """Limits found above the container's share (a tenant's own), set back to it."""
    ok: int = 0
    gone: int = 0
    refused: tuple[tuple[str, Refusal], ...] = ()


WINDOWS_KEPT = 1024
"""Windows kept for the metric's quantiles (a few hours of container starts on a busy node)."""

NVML_RETRY = Backoff(initial_s=1.0, maximum_s=60.0)
"""Retries of a GPU whose NVML call failed: an error that lasts is retried once a minute,
a passing one within the next round or two."""


class CapsApplier:
    """Applies, checks and repairs per-container limits; remembers what it confirmed, and
    why what it could not confirm is not."""

    def __init__(
        self,
        limiter: MemoryLimiter,
        capabilities: Mapping[str, GpuCapability],
        *,
        cgroup_root: Path = CGROUP_ROOT,
        wall_clock: Callable[[], float] = time.time,
        clock: Callable[[], float] = time.monotonic,
        retry: Backoff = NVML_RETRY,
    ) -> None:
        self._limiter = limiter
        self._capabilities = dict(capabilities)
        self._root = cgroup_root
        self._clock = wall_clock
        self._now = clock
        self._retry = retry
        self._confirmed: dict[tuple[ContainerKey, str], MemoryLimits] = {}
        self._told: set[tuple[ContainerKey, str]] = set()
        self._pending: dict[tuple[ContainerKey, str], str] = {}
        self._confirmed_once: set[str] = set()
        self._failures: dict[str, tuple[int, float, str]] = {}
        """GPU -> (failed attempts in a row, monotonic time of the next try, the error)."""
        self._unsure: frozenset[str] = frozenset()
        """GPUs whose last limit call failed with an NVML error and none confirmed since:
        unlike `_failures`, kept when nobody is left to retry there (the toolkit's hook
        would make the same call for the next container and fail it)."""
        self.windows_s: list[float] = []
        """Per container and GPU, cgroup creation -> limits confirmed, in seconds: the
        latest WINDOWS_KEPT, since every scrape sorts them for the window's quantiles and
        a node's containers come and go for the agent's whole life."""

    @property
    def capabilities(self) -> dict[str, GpuCapability]:
        return dict(self._capabilities)

    def hook_capabilities(self) -> dict[str, GpuCapability]:
        """Each GPU's capability as the toolkit's hook would meet it now, for what is
        handed to containers from now on (Allocate's variables, DRA claims' specs): the
        refusals found since start, and a GPU whose NVML limit calls failed, until a retry
        confirms limits there, as `nvml-error` (the hook makes the same call, and a hook
        that fails refuses the pod). Read from the event loop while a round runs in a
        worker thread: both fields are replaced whole, never changed in place."""
        unsure = self._unsure
        return {
            gpu: GpuCapability(gpu, "nvml-error") if cap.capable and gpu in unsure else cap
            for gpu, cap in self._capabilities.copy().items()
        }

    def capped(self) -> frozenset[tuple[ContainerKey, str]]:
        """(container, GPU) pairs whose limits were confirmed on the last round."""
        return frozenset(self._confirmed)

    def readings(self) -> dict[tuple[ContainerKey, str], MemoryLimits]:
        """The limits last read back, with the memory each cgroup used (`used_bytes`)."""
        return dict(self._confirmed)

    def pending(self) -> dict[tuple[ContainerKey, str], str]:
        """(container, GPU) -> why its limits are not confirmed, after the last round."""
        return dict(self._pending)

    def gpu_states(self) -> dict[str, GpuCaps]:
        """Per GPU: confirmed at least once, and what blocks it now (NVML failing)."""
        out: dict[str, GpuCaps] = {}
        now = self._now()
        for gpu in self._capabilities:
            blocked = ""
            failure = self._failures.get(gpu)
            if failure is not None:
                _, at, error = failure
                blocked = (
                    f"NVML failed on this GPU ({error}); retrying in {max(0.0, at - now):.0f} s"
                )
            out[gpu] = GpuCaps(gpu in self._confirmed_once, blocked)
        return out

    def sync(
        self,
        wanted: Mapping[tuple[ContainerKey, str], MemoryLimits],
        cgroups: Mapping[ContainerKey, str],
        missing: str = "",
    ) -> CapsRound:
        """One round (blocking). `cgroups`: container -> its cgroup's full path, for the
        containers the pod watch has seen started (`resolve_cgroup`); `missing` says why a
        wanted container has none (for its pending reason)."""
        counts = {"set": 0, "repaired": 0, "raised": 0, "ok": 0, "gone": 0}
        refused: list[tuple[str, Refusal]] = []
        confirmed: dict[tuple[ContainerKey, str], MemoryLimits] = {}
        pending: dict[tuple[ContainerKey, str], str] = {}
        failed_now: set[str] = set()
        now = self._now()
        for (key, gpu), limits in sorted(wanted.items()):
            cap = self._capabilities.get(gpu)
            if cap is None or not cap.capable:
                continue
            path = cgroups.get(key)
            if path is None:
                pending[(key, gpu)] = missing or f"its cgroup was not found under {self._root}"
                continue
            failure = self._failures.get(gpu)
            if failure is not None and (gpu in failed_now or now < failure[1]):
                pending[(key, gpu)] = f"NVML failed on this GPU ({failure[2]}); retrying"
                continue
            if limits.soft_bytes > limits.hard_bytes:
                # The toolkit's hook refuses this; NVML's answer is not documented: never asked.
                pending[(key, gpu)] = f"its request is above its limit ({limits})"
                if (key, gpu) not in self._told:
                    self._told.add((key, gpu))
                    log.warning(
                        "caps-request-above-limit",
                        container=str(key),
                        gpu=gpu,
                        limits=str(limits),
                        then="not capped; the memory guard's mode applies",
                    )
                continue
            try:
                read = self._limiter.get_memory_limits(gpu, path)
                outcome = check_outcome(limits, read, self._confirmed.get((key, gpu)))
                if outcome == "raised":
                    log.warning(
                        "caps-limit-raised",
                        container=str(key),
                        gpu=gpu,
                        cgroup=path,
                        found=str(read),
                        share=str(limits),
                        then="set back to its share; the guard watches it until confirmed",
                    )
                if outcome != "ok":
                    self._limiter.set_memory_limits(gpu, path, limits)
                    read = self._limiter.get_memory_limits(gpu, path)
                    if not read.same_limits(limits):
                        raise MemoryLimitsError(
                            "nvml-error", f"GPU {gpu}, cgroup {path}: read back {read}"
                        )
                    log.info(
                        "caps-applied",
                        container=str(key),
                        gpu=gpu,
                        cgroup=path,
                        limits=str(limits),
                        outcome=outcome,
                    )
                counts[outcome] += 1
            except MemoryLimitsError as exc:
                if exc.refusal == "gone":
                    counts["gone"] += 1
                    log.debug("caps-container-gone", container=str(key), gpu=gpu, error=str(exc))
                    continue
                if exc.refusal in ("driver-without-call", "mig"):
                    refusal: Refusal = "mig" if exc.refusal == "mig" else "driver-without-call"
                    self._capabilities = {**self._capabilities, gpu: GpuCapability(gpu, refusal)}
                    refused.append((gpu, refusal))
                    log.warning(
                        "caps-refused",
                        gpu=gpu,
                        refusal=refusal,
                        error=str(exc),
                        then="no caps on this GPU; the memory guard's mode applies there",
                    )
                    continue
                pending[(key, gpu)] = f"NVML failed on this GPU ({exc}); retrying"
                if gpu not in failed_now:
                    failed_now.add(gpu)
                    self._unsure = self._unsure | {gpu}
                    self._fail(gpu, str(exc), now)
                continue
            pair = (key, gpu)
            if outcome != "ok" and pair not in self._confirmed:
                # The agent's own first apply: the time the workload could run uncapped. A
                # container whose limits were already there (the CDI hook) had no window.
                self._measure(path)
            confirmed[pair] = read
            self._confirmed_once.add(gpu)
            if gpu not in failed_now and (gpu in self._unsure or gpu in self._failures):
                self._unsure = self._unsure - {gpu}
                self._failures.pop(gpu, None)
                log.info("caps-nvml-recovered", gpu=gpu)
        for gpu in list(self._failures):
            if gpu not in failed_now and not any(g == gpu for _, g in wanted):
                del self._failures[gpu]  # nobody left to cap there: nothing to retry
        self._confirmed = confirmed
        self._pending = pending
        return CapsRound(refused=tuple(refused), **counts)

    def _fail(self, gpu: str, error: str, now: float) -> None:
        attempts = self._failures.get(gpu, (0, 0.0, ""))[0] + 1
        delay = self._retry.delay(attempts)
        self._failures[gpu] = (attempts, now + delay, error)
        log.warning(
            "caps-nvml-error",
            gpu=gpu,
            error=error,
            attempt=attempts,
            retry_in_s=delay,
            then="not capped until a retry confirms the limits; the memory guard's mode applies",
        )

    def _measure(self, path: str) -> None:
        try:
            born = os.stat(path).st_mtime
        except OSError:
            return
        self.windows_s.append(max(0.0, self._clock() - born))
        del self.windows_s[:-WINDOWS_KEPT]


def live_cgroups(
    cgroup_root: Path, containers: Iterable[tuple[ContainerKey, str, str]]
) -> dict[ContainerKey, str]:
    """container -> its cgroup path, for (container, pod UID, container ID) triples from the
    pod watch; containers whose cgroup is not (or no longer) there are left out."""
    out: dict[ContainerKey, str] = {}
    for key, uid, cid in containers:
        path = resolve_cgroup(cgroup_root, uid, cid)
        if path is not None:
            out[key] = path
    return out


def process_cgroups(
    cgroup_root: Path, proc_root: Path, pids_by_container: Mapping[ContainerKey, Iterable[int]]
) -> dict[ContainerKey, str]:
    """container -> its cgroup path, from its GPU processes' `/proc/<pid>/cgroup` (the
    cgroup v2 line, `0::/path`): the fallback when the pod watch is not there (no API
    access), at the cost of seeing a container only once it has a GPU context.

    The line is relative to the *reader's* cgroup namespace: read from the agent's pod it is
    `0::/../../kubepods-...-pod<uid>.slice/cri-containerd-<id>.scope`, which no root joins
    to a path. So the pod UID and container ID are read from it (`core.cgroups`) and looked
    up under the root as the pod watch's are; the line as given is the fallback."""
    out: dict[ContainerKey, str] = {}
    for key, pids in pids_by_container.items():
        for pid in pids:
            try:
                text = (proc_root / str(pid) / "cgroup").read_text(encoding="utf-8")
            except OSError:
                continue
            identity = parse_cgroup(text)
            if identity is not None and identity.container_id:
                found = resolve_cgroup(cgroup_root, identity.pod_uid, identity.container_id)
                if found is not None:
                    out[key] = found
                    break
            rel = next((ln[3:].strip() for ln in text.splitlines() if ln.startswith("0::")), None)
            if rel and ".." not in rel.split("/"):
                path = cgroup_root / rel.lstrip("/")
                if path.is_dir():
                    out[key] = str(path)
                    break
    return out


PodsSource = Callable[[], Iterable[tuple[ContainerKey, str, str]] | None]
"""(container, pod UID, container ID) of the started containers the pod watch knows; None
without a pod watch (no API access)."""


class CapsService:
    """The agent's caps loop: every `interval_s`, the round `CapsApplier.sync` describes,
    for the containers PodResources lists on capable GPUs. A node where no GPU is capable
    (every node before r615) does nothing at all after the first look."""

    def __init__(
        self,
        applier: CapsApplier,
        *,
        policy: CapPolicy,
        current_plan: Callable[[], Plan | None],
        assignments: PodAssignments | None,
        pods: PodsSource | None = None,
        pids: Callable[[], Mapping[ContainerKey, Iterable[int]]] | None = None,
        cgroup_root: Path = CGROUP_ROOT,
        proc_root: Path = Path("/proc"),
        interval_s: float = 1.0,
    ) -> None:
        self.applier = applier
        self.policy = policy
        self._plan = current_plan
        self._assignments = assignments
        self._pods = pods
        self._pids = pids
        self._root = cgroup_root
        self._proc = proc_root
        self.interval_s = interval_s
        self.rounds = 0
        self._assignments_down = False

    def any_capable(self) -> bool:
        return any(c.capable for c in self.applier.capabilities.values())

    async def round(self) -> CapsRound | None:
        plan = self._plan()
        if plan is None or self._assignments is None or not self.any_capable():
            return None
        try:
            held = await self._assignments.list_assignments()
        except PodResourcesError as exc:
            # One warning while it lasts (the kubelet restarting, the socket not mounted),
            # not a traceback a round; nothing is confirmed meanwhile, so nothing is
            # reported capped and the guard keeps every container in view.
            if not self._assignments_down:
                self._assignments_down = True
                log.warning(
                    "caps-pod-resources-unavailable",
                    error=str(exc),
                    then="no container is capped until the kubelet answers",
                )
            self.rounds += 1
            return await asyncio.to_thread(self.applier.sync, {}, {})
        if self._assignments_down:
            self._assignments_down = False
            log.info("caps-pod-resources-back")
        wanted = node_protection(plan, held, self.policy).limits(self.applier.capabilities)
        keys = {k for k, _ in wanted}
        listed = self._pods() if self._pods is not None else None
        triples = [t for t in (listed or ()) if t[0] in keys]
        cgroups = await asyncio.to_thread(live_cgroups, self._root, triples) if triples else {}
        missing = keys - set(cgroups)
        if missing and self._pids is not None:
            pids = {k: list(v) for k, v in self._pids().items() if k in missing}
            cgroups.update(await asyncio.to_thread(process_cgroups, self._root, self._proc, pids))
        why = f"its cgroup was not found under {self._root}"
        if listed is None and self._pods is not None:
            why = "the pod watch has not listed this node's pods yet"
        self.rounds += 1
        return await asyncio.to_thread(self.applier.sync, wanted, cgroups, why)

    async def run(self, stop: asyncio.Event) -> None:
        if not self.any_capable():
            return
        log.info("caps-started", policy=self.policy, interval_s=self.interval_s)
        while not stop.is_set():
            try:
                await self.round()
            except Exception:
                log.exception("caps-round-failed")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=self.interval_s)


class _PodLike(Protocol):
    @property
    def uid(self) -> str: ...
    @property
    def namespace(self) -> str: ...
    @property
    def name(self) -> str: ...
    @property
    def containers(self) -> tuple[tuple[str, str], ...]: ...


def pod_containers(pods: Iterable[_PodLike] | None) -> list[tuple[ContainerKey, str, str]] | None:
    """(container, pod UID, container ID) for each started container of the pod watch's
    entries (`k8s.pods.PodEntry`); None before the watch's first list."""
    if pods is None:
        return None
    return [
        (ContainerKey(p.namespace, p.name, name), p.uid, cid)
        for p in pods
        for cid, name in p.containers
    ]


class HookProgram:
    """The toolkit's hook as DRA claim specs call it, checked again at every use: a hook
    that fails refuses the pod (the runtime fails the container), so a spec names it only
    where it can work: a node able to take limits (cgroup v2, root) with a capable GPU, and
    an executable program at the hook's path as the agent sees it (`seen_at`: in the chart,
    the host's directory mounted elsewhere). The toolkit installed, removed or upgraded
    while the agent runs changes the next Prepare's spec, logged once per change."""

    def __init__(
        self,
        hook_path: str,
        driver_root: str,
        node: NodeCapability,
        any_capable: bool,
        *,
        seen_at: str = "",
    ) -> None:
        self.hook_path = hook_path
        self.driver_root = driver_root
        self._seen_at = Path(seen_at or hook_path) if hook_path else None
        self._fixed = ""
        refusal = node.refusal()
        if not hook_path:
            self._fixed = "turned off (--memory-caps-hook-path '')"
        elif refusal is not None:
            self._fixed = REFUSAL_TEXT[refusal]
        elif not any_capable:
            self._fixed = "no GPU of this node can be capped"
        self._last: bool | None = None

    def why_not(self) -> str:
        """ "" when the hook can be written now, else the reason."""
        if self._fixed:
            return self._fixed
        assert self._seen_at is not None
        if not self._seen_at.is_file():
            return f"no hook program at {self._seen_at} (mount it, or set --memory-caps-hook-path)"
        if not os.access(self._seen_at, os.X_OK):
            return f"the hook program at {self._seen_at} is not executable"
        return ""

    def cdi(self) -> CdiCaps | None:
        why = self.why_not()
        usable = not why
        if usable != self._last:
            self._last = usable
            if usable:
                log.info("caps-hook-on", path=self.hook_path)
            elif self._fixed:
                log.info("caps-hook-off", path=self.hook_path, reason=why)
            else:
                log.info(
                    "caps-hook-off",
                    path=self.hook_path,
                    reason=why,
                    then="the agent applies the limits after the container starts",
                )
        return CdiCaps(self.hook_path, self.driver_root) if usable else None


def cdi_hook(
    hook_path: str, driver_root: str, node: NodeCapability, any_capable: bool
) -> CdiCaps | None:
    """The hook as one check at this moment (`HookProgram` checks again at every use)."""
    return HookProgram(hook_path, driver_root, node, any_capable).cdi()
