"""What the memory guard buys: well-behaved pods lost to OOM, reaction time, the safe leak rate.

Runs many seeded random scenarios of pods time-slicing one GPU through the real policy
(`gpuslice.core.guard.evaluate`) and the simulator's memory model
(`gpuslice.backends.simulated.memory`: CUDA-like, an allocation that does not fit kills its
process) in **simulated time** (`gpuslice.demo.guardsim`): fast and deterministic, no
daemon, no sockets. The daemon path (signals, Events) is covered by the tests.

Each scenario: a GPU (T4, A10, L40S or H100), N time-slicing replicas (2-8) and N pods,
one (sometimes two) leaking without bound at a rate given as a multiple of
reserve / poll interval, the others well-behaved: they ramp up to a target within their
share, some with bursts that also stay within it. Pods start at random times.

Figures, all in one run:

* fraction of well-behaved pods that die of OOM with the guard off (NVIDIA's behaviour),
  observe, and enforce (grace 0 and the default grace);
* reaction time from free memory crossing the reserve to the signal, p50/p99, as a ratio
  to the poll interval;
* per leak rate (x reserve/interval) the well-behaved losses, and the largest rate with none;
* caps (`core.caps`): the driver holding each pod to soft = its share and a hard limit
  (`strict`: the share; `borrow`: the whole GPU) from its start, the guard stepped back, on
  the same scenarios: well-behaved pods lost, pods stopped by the agent, and leakers whose
  own allocation failed. The driver's limits are the simulator's model of NVIDIA's
  documented semantics (`core.gpumemory`), not measured on a GPU.
* issue 40's cases, each with caps and with the guard, the shares and limits from the real
  policy (`core.protection`): a JAX-like pod preallocating 75 % of the GPU inside the
  device-plugin window (caps applied a poll after it starts), three pods on one share
  claim, and `--consumable-shares unlimited` (claims that reserved no memory beside one
  that did), against NVIDIA's limits and the per-pod reading that came before.

    .venv/bin/python bench/bench_guard.py            # 40 scenarios per rate (~1 min)
    .venv/bin/python bench/bench_guard.py --quick    # 4 per rate (a smoke run)
"""

from __future__ import annotations

import argparse
import dataclasses
import random
import time
from dataclasses import dataclass

from gpuslice.backends.simulated.memory import Allocation
from gpuslice.core.caps import CapPolicy
from gpuslice.core.devices import Gpu, GpuUuid
from gpuslice.core.guard import ContainerKey, GuardParams, Reserve, lookahead_for
from gpuslice.core.protection import node_protection
from gpuslice.core.sharing.model import (
    AdvertisedDevice,
    DeviceId,
    PhysicalDevice,
    Plan,
    ResourceName,
    ResourcePlan,
    SharingStrategy,
)
from gpuslice.core.units import MIB
from gpuslice.demo.guardsim import SimPod, SimResult, simulate
from gpuslice.ports import ContainerDevices

GPUS = (("T4", 15360), ("A10", 23028), ("L40S", 46068), ("H100", 81559))
MULTIPLES = (0.25, 0.5, 0.75, 0.9, 1.0, 1.25, 1.5, 2.0, 3.0, 4.0, 8.0)
INTERVAL_S = 1.0
RESERVE = Reserve(fraction=0.10)
DEFAULT_GRACE_S = GuardParams().grace_s
UNTIL_S = 90.0
EXIT_S = 0.2
"""Seconds a signalled process takes to exit and free its memory (guardsim's default)."""
LOOKAHEAD_S = lookahead_for(INTERVAL_S)
"""What the agent sets `GuardParams.lookahead_s` to: the poll interval plus 0.25 s."""


@dataclass(frozen=True)
class Scenario:
    total_mib: int
    replicas: int
    pods: tuple[SimPod, ...]


def scenario(rng: random.Random, multiple: float) -> Scenario:
    _name, total = rng.choice(GPUS)
    n = rng.randint(2, 8)
    share = total // n
    reserve = RESERVE.of(total)
    unit = reserve / INTERVAL_S  # MiB/s that eat the reserve in one poll interval
    leakers = 2 if n >= 4 and rng.random() < 0.25 else 1
    pods: list[SimPod] = []
    for i in range(n):
        start_s = rng.uniform(0, 30)
        if i < leakers:
            alloc = Allocation(
                start_mib=int(rng.uniform(0.2, 0.6) * share),
                rate_mib_s=multiple * unit / leakers,
            )
            pods.append(SimPod(f"leak-{i}", alloc, start_s, well_behaved=False))
            continue
        target = int(rng.uniform(0.5, 0.95) * share)
        first = min(int(rng.uniform(0.05, 0.5) * reserve), target)
        ramp = rng.uniform(0.01, 0.05) * unit
        if rng.random() < 0.3:
            burst = int(rng.uniform(0.0, 0.95 * share - target))
            alloc = Allocation(
                start_mib=first,
                rate_mib_s=ramp,
                target_mib=target,
                burst_mib=max(0, burst),
                burst_every_s=rng.uniform(5, 20),
                burst_s=rng.uniform(0.5, 3),
            )
            name = f"bursty-{i}"
        else:
            alloc = Allocation(start_mib=first, rate_mib_s=ramp, target_mib=target)
            name = f"steady-{i}"
        pods.append(SimPod(name, alloc, start_s))
    return Scenario(total, n, tuple(pods))


def run(
    s: Scenario,
    mode: str,
    grace_s: float,
    phase: float,
    lookahead_s: float,
    caps: CapPolicy | None = None,
) -> SimResult:
    params = GuardParams(
        mode="off" if caps is not None else mode,  # type: ignore[arg-type]
        reserve=RESERVE,
        grace_s=grace_s,
        lookahead_s=lookahead_s,
    )
    return simulate(
        s.total_mib,
        s.replicas,
        s.pods,
        params,
        interval_s=INTERVAL_S,
        until_s=UNTIL_S,
        exit_s=EXIT_S,
        first_poll_s=phase,
        caps=caps,
    )


# -- issue 40: who holds what (core.protection), with caps and with the guard --------------

GPU = "GPU-sim-0"
WINDOW_S = INTERVAL_S
"""The device-plugin window: the agent applies a container's limits at its next round."""


@dataclass(frozen=True)
class Row:
    label: str
    mode: str
    grace_s: float
    caps: CapPolicy | None
    limits: str = "policy"
    """`policy`: each pod's share and limits from `core.protection`; `nvidia`: what NVIDIA's
    driver gives (a share that reserved nothing: soft = hard = the GPU); `per-pod`: each
    consumer of a claim as if it held the claim alone (before issue 40)."""
    window_s: float = 0.0


@dataclass(frozen=True)
class ClaimPod:
    name: str
    claim: str
    allocation: Allocation
    start_s: float
    well_behaved: bool


def share_pods(
    total: int, claims: dict[str, int], pods: list[ClaimPod], policy: CapPolicy, limits: str
) -> tuple[SimPod, ...]:
    """The pods of one GPU offered as consumable shares, each claim reserving `claims[c]`
    MiB (0: nothing), their shares and limits from the real policy."""
    gpu = Gpu(0, GpuUuid(GPU), "sim", total, 100, (9, 0), "0:0:0.0", 0)
    phys = PhysicalDevice.of_gpu(gpu)
    resources = []
    for n, (claim, mib) in enumerate(claims.items()):
        name = ResourceName(f"claim:ml/{claim}")
        dev = AdvertisedDevice(DeviceId(f"node/gpu-0/s{n}"), phys, 0, 1, None, mib)
        resources.append(ResourcePlan(name, name, SharingStrategy.TIME_SLICING, False, (dev,)))
    plan = Plan(tuple(resources))
    ids = {str(r.name): r.devices[0].id for r in plan.resources}
    held = [
        ContainerDevices(
            "default", p.name, "main", f"claim:ml/{p.claim}", (ids[f"claim:ml/{p.claim}"],)
        )
        for p in pods
    ]
    protection = node_protection(plan, held, policy)
    out = []
    for p in pods:
        hold = protection.hold_of(ContainerKey("default", p.name, "main"), GPU)
        assert hold is not None
        each = hold.each()
        share, soft, hard = hold.soft_bytes, each.soft_bytes, each.hard_bytes
        holder: str | None = hold.holder
        if limits == "nvidia" and claims[p.claim] == 0:
            share = soft = hard = total * MIB  # NVIDIA's: the whole GPU, soft and hard
        if limits == "per-pod":
            soft, hard = share, (share if policy == "strict" else total * MIB)
            holder = None
        out.append(
            SimPod(
                p.name,
                p.allocation,
                p.start_s,
                well_behaved=p.well_behaved,
                share_mib=share // MIB,
                soft_mib=soft // MIB,
                hard_mib=hard // MIB,
                holder=holder if len(hold.consumers) > 1 else None,
            )
        )
    return tuple(out)


def window_case(rng: random.Random) -> tuple[int, int, tuple[SimPod, ...]]:
    """Item 2: device-plugin replicas; one pod preallocates 75 % of the GPU at its first
    call (JAX's default), inside the window before the agent's caps land."""
    _name, total = rng.choice(GPUS)
    n = rng.randint(3, 6)
    share = total // n
    reserve = RESERVE.of(total)
    pods = [SimPod("jax", Allocation(start_mib=int(0.75 * total)), rng.uniform(0, 20), 1, False)]
    for i in range(n - 1):
        target = int(rng.uniform(0.5, 0.9) * share)
        ramp = rng.uniform(0.01, 0.05) * reserve / INTERVAL_S
        first = min(int(rng.uniform(0.05, 0.5) * reserve), target)
        alloc = Allocation(start_mib=first, rate_mib_s=ramp, target_mib=target)
        pods.append(SimPod(f"steady-{i}", alloc, rng.uniform(0, 40)))
    return total, n, tuple(pods)


def team_case(rng: random.Random) -> tuple[int, dict[str, int], list[ClaimPod]]:
    """Item 5: a claim of a quarter of the GPU used by three pods, each growing to 80 % of
    it (each alone within it, together 2.4 times it), beside three claims of a quarter
    with one well-behaved pod each."""
    _name, total = rng.choice(GPUS)
    quarter = total // 4
    reserve = RESERVE.of(total)
    claims = {"team": quarter, **{f"c{i}": quarter for i in range(3)}}
    pods = []
    for i in range(3):
        grow = Allocation(
            start_mib=int(0.1 * quarter),
            rate_mib_s=rng.uniform(0.05, 0.5) * reserve / INTERVAL_S,
            target_mib=int(0.8 * quarter),
        )
        pods.append(ClaimPod(f"team-{i}", "team", grow, rng.uniform(0, 10), False))
    for i in range(3):
        target = int(rng.uniform(0.5, 0.9) * quarter)
        ramp = rng.uniform(0.01, 0.05) * reserve / INTERVAL_S
        alloc = Allocation(
            start_mib=min(int(0.2 * reserve), target), rate_mib_s=ramp, target_mib=target
        )
        pods.append(ClaimPod(f"steady-{i}", f"c{i}", alloc, rng.uniform(0, 40), True))
    return total, claims, pods


def unlimited_case(rng: random.Random) -> tuple[int, dict[str, int], list[ClaimPod]]:
    """Item 6: `--consumable-shares unlimited`: one claim reserved 45 % of the GPU and
    starts late, two reserved nothing and leak from the start."""
    _name, total = rng.choice(GPUS)
    sized = int(0.45 * total)
    reserve = RESERVE.of(total)
    claims = {"sized": sized, "free-0": 0, "free-1": 0}
    pods = []
    for i in range(2):
        leak = Allocation(
            start_mib=int(0.05 * total), rate_mib_s=rng.uniform(0.25, 2.0) * reserve / INTERVAL_S
        )
        pods.append(ClaimPod(f"free-{i}", f"free-{i}", leak, rng.uniform(0, 5), False))
    target = int(rng.uniform(0.6, 0.95) * sized)
    alloc = Allocation(start_mib=int(0.5 * target), rate_mib_s=0.05 * reserve, target_mib=target)
    pods.append(ClaimPod("sized", "sized", alloc, rng.uniform(10, 30), True))
    return total, claims, pods


def over_at_end(r: SimResult, pods: tuple[SimPod, ...], total: int) -> int:
    """Holders (a claim's pods together, else a pod) still running above their share."""
    used: dict[str, int] = {}
    share: dict[str, int] = {}
    for p in pods:
        if r.fates.get(p.name) != "running":
            continue
        holder = p.holder or p.name
        used[holder] = used.get(holder, 0) + r.last_used_mib.get(p.name, 0)
        share[holder] = p.share_mib if p.share_mib is not None else total
    return sum(1 for h in used if used[h] > share[h])


def holder_rows(per_case: int, seed: int) -> None:
    """Issue 40's cases, each row the same scenarios: well-behaved pods lost, pods stopped,
    pods over their share whose own allocation failed, holders left over their share."""
    cases: dict[str, tuple[Row, ...]] = {
        "allocation inside the device-plugin window (JAX 75 % at its first call)": (
            Row("off (NVIDIA's behaviour)", "off", 0.0, None),
            Row("caps strict, 1 s window, guard off", "off", 0.0, "strict", window_s=WINDOW_S),
            Row(
                "caps strict, 1 s window, enforce grace 0",
                "enforce",
                0.0,
                "strict",
                window_s=WINDOW_S,
            ),
            Row(
                f"caps strict, 1 s window, enforce grace {DEFAULT_GRACE_S:g} s",
                "enforce",
                DEFAULT_GRACE_S,
                "strict",
                window_s=WINDOW_S,
            ),
            Row("guard only, enforce grace 0", "enforce", 0.0, None),
        ),
        "one share claim, three pods": (
            Row("off", "off", 0.0, None),
            Row(
                "enforce grace 0, each pod its claim's share (before)",
                "enforce",
                0.0,
                None,
                "per-pod",
            ),
            Row("enforce grace 0, the claim one holder", "enforce", 0.0, None),
            Row(
                "caps strict, each pod its claim's share (before)", "off", 0.0, "strict", "per-pod"
            ),
            Row("caps strict, the claim's memory divided", "off", 0.0, "strict"),
            Row("caps strict divided + enforce grace 0", "enforce", 0.0, "strict"),
        ),
        "--consumable-shares unlimited (two claims reserved nothing)": (
            Row("off", "off", 0.0, None),
            Row("caps, NVIDIA's limits (soft = hard = GPU)", "off", 0.0, "strict", "nvidia"),
            Row("caps strict (soft 0, hard = unreserved)", "off", 0.0, "strict"),
            Row("enforce grace 0, NVIDIA's share (the GPU)", "enforce", 0.0, None, "nvidia"),
            Row("enforce grace 0, share 0", "enforce", 0.0, None),
            Row("caps strict + enforce grace 0", "enforce", 0.0, "strict"),
        ),
    }
    rng = random.Random(seed)
    for title, rows in cases.items():
        totals = {r.label: [0, 0, 0, 0, 0] for r in rows}  # lost, stopped, failed, over, wb
        overrunners = 0
        for _ in range(per_case):
            phase = rng.uniform(0, INTERVAL_S)
            if title.startswith("allocation"):
                total, n, plain = window_case(rng)
                variants = {r.label: (n, plain) for r in rows}
            else:
                make = team_case if title.startswith("one share") else unlimited_case
                total, claims, cpods = make(rng)
                variants = {
                    r.label: (1, share_pods(total, claims, cpods, r.caps or "strict", r.limits))
                    for r in rows
                }
            overrunners += sum(1 for p in next(iter(variants.values()))[1] if not p.well_behaved)
            for r in rows:
                n, pods = variants[r.label]
                params = GuardParams(
                    mode=r.mode,  # type: ignore[arg-type]
                    reserve=RESERVE,
                    grace_s=r.grace_s,
                    lookahead_s=LOOKAHEAD_S if r.mode == "enforce" else 0.0,
                )
                res = simulate(
                    total, n, pods, params, interval_s=INTERVAL_S, until_s=UNTIL_S,
                    exit_s=EXIT_S, first_poll_s=phase, caps=r.caps, caps_after_s=r.window_s,
                )  # fmt: skip
                t = totals[r.label]
                t[0] += len(res.lost(pods))
                t[1] += res.stopped()
                t[2] += sum(
                    1 for p in pods if not p.well_behaved and res.fates[p.name] in ("capped", "oom")
                )
                t[3] += over_at_end(res, pods, total)
                t[4] += sum(1 for p in pods if p.well_behaved)
        print(f"{title} ({per_case} scenarios, {overrunners} pods over their share):")
        for r in rows:
            lost, stopped, failed, over, wb = totals[r.label]
            print(
                f"  {r.label:<52} well-behaved lost {lost:>3}/{wb:<3} stopped {stopped:>3}  "
                f"own allocation failed {failed:>3}  still borrowing at the end {over:>3}"
            )
        print()


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--per-rate", type=int, default=40, help="scenarios per leak rate")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--quick", action="store_true", help="4 scenarios per rate: a smoke run")
    args = ap.parse_args()
    per_rate = 4 if args.quick else args.per_rate
    g = f"grace {DEFAULT_GRACE_S:g} s"
    modes: tuple[tuple[str, str, float, float, CapPolicy | None], ...] = (
        # label, mode, grace, lookahead (the agent's: poll interval + 0.25 s), caps
        ("off", "off", 0.0, 0.0, None),
        ("observe", "observe", 0.0, 0.0, None),
        ("enforce, grace 0, no projection", "enforce", 0.0, 0.0, None),
        (f"enforce, {g}, no projection", "enforce", DEFAULT_GRACE_S, 0.0, None),
        ("enforce, grace 0", "enforce", 0.0, LOOKAHEAD_S, None),
        (f"enforce, {g}", "enforce", DEFAULT_GRACE_S, LOOKAHEAD_S, None),
        ("caps, strict (hard = share)", "caps", 0.0, 0.0, "strict"),
        ("caps, borrow (hard = GPU)", "caps", 0.0, 0.0, "borrow"),
    )
    rng = random.Random(args.seed)
    started = time.perf_counter()
    lost = {label: dict.fromkeys(MULTIPLES, 0) for label, *_ in modes}
    total_wb = dict.fromkeys(MULTIPLES, 0)
    reactions: dict[str, list[float]] = {label: [] for label, *_ in modes}
    leakers_stopped = {label: 0 for label, *_ in modes}
    stopped = {label: dict.fromkeys(MULTIPLES, 0) for label, *_ in modes}
    leakers_capped = {label: 0 for label, *_ in modes}
    leakers_total = 0
    for multiple in MULTIPLES:
        for _ in range(per_rate):
            s = scenario(rng, multiple)
            phase = rng.uniform(0, INTERVAL_S)  # polls are not aligned with the pods
            wb = sum(1 for p in s.pods if p.well_behaved)
            total_wb[multiple] += wb
            leakers_total += len(s.pods) - wb
            for label, mode, grace, lookahead, caps in modes:
                r = run(s, mode, grace, phase, lookahead, caps)
                lost[label][multiple] += len(r.lost(s.pods))
                stopped[label][multiple] += r.stopped()
                leakers_capped[label] += sum(
                    1 for p in s.pods if not p.well_behaved and r.fates[p.name] in ("capped", "oom")
                )
                reactions[label].extend(x / INTERVAL_S for x in r.reactions_s)
                leakers_stopped[label] += sum(
                    1 for p in s.pods if not p.well_behaved and r.fates[p.name] == "reclaimed"
                )
    elapsed = time.perf_counter() - started
    n_scen = per_rate * len(MULTIPLES)
    all_wb = sum(total_wb.values())
    print(
        f"bench_guard: {n_scen} scenarios ({per_rate} per leak rate), {all_wb} well-behaved "
        f"pods, {leakers_total} leakers; reserve {RESERVE}, poll {INTERVAL_S:g} s; "
        f"simulated time, {elapsed:.1f} s wall"
    )
    print()
    print("well-behaved pods lost to OOM (all rates together):")
    for label, *_ in modes:
        n = sum(lost[label].values())
        n_stopped = sum(stopped[label].values())
        print(
            f"  {label:<34} {n:>5} / {all_wb} = {n / all_wb:6.1%}   "
            f"pods stopped by the agent: {n_stopped:>4}   "
            f"leakers stopped: {leakers_stopped[label]}/{leakers_total}, "
            f"own allocation failed: {leakers_capped[label]}/{leakers_total}"
        )
    print()
    print(
        "reaction, free memory below the reserve -> signal, in poll intervals "
        "(leakers stopped before free memory reached the reserve are not counted):"
    )
    for label, mode, *_ in modes:
        if mode != "enforce":
            continue
        xs = reactions[label]
        print(
            f"  {label:<34} p50 {pct(xs, 0.5):.2f}  p99 {pct(xs, 0.99):.2f}  "
            f"max {max(xs, default=float('nan')):.2f}  (n={len(xs)})"
        )
    print()
    header = "leak rate (x reserve/interval)"
    print(f"{header:<44}" + "".join(f"{m:>7g}" for m in MULTIPLES))
    for label, *_ in modes:
        row = "".join(f"{lost[label][m] / total_wb[m]:>7.1%}" for m in MULTIPLES)
        print(f"  lost, {label:<36}{row}")
    for label, *_ in modes:
        row = "".join(f"{stopped[label][m]:>7d}" for m in MULTIPLES)
        print(f"  stopped, {label:<33}{row}")
    print()
    for label, mode, *_ in modes:
        if mode not in ("enforce", "caps"):
            continue
        safe = [m for m in MULTIPLES if all(lost[label][x] == 0 for x in MULTIPLES if x <= m)]
        print(
            f"largest leak rate with no well-behaved pod lost, {label}: "
            f"{max(safe, default=0.0):g} x reserve/interval"
        )
    bound = INTERVAL_S / (INTERVAL_S + EXIT_S)
    print(
        f"(without projection the bound is reserve / (interval + exit) = {bound:.2f} x, a "
        f"signalled process taking {EXIT_S:g} s to free its memory; with it the guard acts on "
        f"the borrowers' growth {LOOKAHEAD_S:g} s beyond the grace ahead of the crossing; "
        "well-behaved pods ramp at up to 0.05 x each)"
    )
    print()
    holder_rows(4 if args.quick else args.per_rate, args.seed)
    caps_rows = [label for label, mode, *_ in modes if mode == "caps"]
    for label in caps_rows:
        print(
            f"caps: {label}: {sum(lost[label].values())} well-behaved pods lost, "
            f"{sum(stopped[label].values())} pods stopped by the agent, "
            f"{leakers_capped[label]}/{leakers_total} leakers failed their own allocation"
        )
    tenant_rows(per_rate, args.seed)
    off = sum(lost["off"].values())
    default = f"enforce, {g}"
    kept = sum(lost[default].values())
    share = f"{kept / off:.2f}x" if off else "n/a (none lost with it off)"
    strict = caps_rows[0]
    capped = sum(lost[strict].values())
    caps_share = f"{capped / off:.2f}x" if off else "n/a"
    print(
        f"Closing note: with the guard enforcing ({default}), {kept} well-behaved pods were "
        f"lost to OOM against {off} with it off: {share} the guard-off losses; it reacted in "
        f"{pct(reactions[default], 0.5):.2f}x the poll interval at p50; with caps "
        f"({strict}) {capped} were lost ({caps_share}) and "
        f"{sum(stopped[strict].values())} pods stopped."
    )


def _neighbour_doubled(s: Scenario) -> Scenario:
    """The same GPU with its last well-behaved pod gone and the first holding two shares:
    a share claim twice as big, so the MPS share daemon's default is two shares."""
    wb = [p for p in s.pods if p.well_behaved]
    if len(wb) < 2:
        return s
    doubled = dataclasses.replace(wb[0], replicas=2)
    pods = tuple(doubled if p is wb[0] else p for p in s.pods if p is not wb[-1])
    return Scenario(s.total_mib, s.replicas, pods)


def tenant_rows(per_rate: int, seed: int) -> None:
    """Issue 40's tenants, on the same kind of scenarios: the leakers are MPS clients that
    unset their `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT` (well-behaved pods keep theirs, their
    share), or pods that set `NVIDIA_GPU_MEMORY_LIMIT` to the whole GPU themselves.

    * MPS, before: the share daemon ran with no pinned limit and the guard only observed
      MPS tenants (modelled as observe: reported, never stopped);
    * MPS, now: the daemon's default is the largest share prepared on the GPU (a client
      that unset its limit gets that) and the guard, enforcing, stops an MPS share over its
      share; with equal shares and with a neighbour holding two shares (the leaker may
      then reach two shares before its own allocation fails);
    * a tenant's own limit variables, device plugin through CDI: the OCI spec holds
      Allocate's pair first and the toolkit's hook takes the first (measured on containerd
      2.4, tests/real_node/test_tenant_env_on_a_real_node.py), so the leaker is capped at
      its share from its start: the caps strict model."""
    rng = random.Random(seed)
    g = GuardParams(mode="enforce", reserve=RESERVE, lookahead_s=LOOKAHEAD_S)
    rows: dict[str, list[int]] = {}
    total_wb = leakers = 0

    def add(label: str, sc: Scenario, r: SimResult) -> None:
        row = rows.setdefault(label, [0, 0, 0])
        row[0] += len(r.lost(sc.pods))
        row[1] += r.stopped()
        row[2] += sum(
            1 for p in sc.pods if not p.well_behaved and r.fates[p.name] in ("capped", "oom")
        )

    for multiple in MULTIPLES:
        for _ in range(per_rate):
            s = scenario(rng, multiple)
            phase = rng.uniform(0, INTERVAL_S)
            total_wb += sum(1 for p in s.pods if p.well_behaved)
            leakers += sum(1 for p in s.pods if not p.well_behaved)
            for label, sc, largest in (
                ("MPS env unset, before (no daemon limit)", s, None),
                ("MPS env unset, now, equal shares", s, 1),
                ("MPS env unset, now, a neighbour holds 2", _neighbour_doubled(s), 2),
            ):
                share = sc.total_mib // sc.replicas
                limits = {p.name: share * p.replicas for p in sc.pods if p.well_behaved}
                for p in sc.pods:
                    if not p.well_behaved:  # unset: the daemon's default, or none
                        limits[p.name] = sc.total_mib if largest is None else share * largest
                mode = "observe" if largest is None else "enforce"
                r = simulate(
                    sc.total_mib, sc.replicas, sc.pods,
                    dataclasses.replace(g, mode=mode),  # type: ignore[arg-type]
                    interval_s=INTERVAL_S, until_s=UNTIL_S, exit_s=EXIT_S,
                    first_poll_s=phase, client_limits_mib=limits,
                )  # fmt: skip
                add(label, sc, r)
            own = run(s, "caps", 0.0, phase, 0.0, "strict")
            add("own NVIDIA_GPU_MEMORY_LIMIT, Allocate's first", s, own)
    print()
    print(
        f"tenants (issue 40): {per_rate * len(MULTIPLES)} scenarios per row; "
        "well-behaved pods lost / pods stopped by the agent / leakers whose own allocation "
        "failed (the 'neighbour holds 2' row has one well-behaved pod fewer per scenario):"
    )
    for label, (lost, stopped, failed) in rows.items():
        print(f"  {label:<46} {lost:>5} lost   {stopped:>5} stopped   {failed:>5} failed")
    print(f"  ({total_wb} well-behaved pods, {leakers} leakers in the base scenarios)")
    print()


if __name__ == "__main__":
    main()
