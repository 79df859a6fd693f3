"""The agent's caps round over the simulated NVML and a cgroup tree in a temp directory:
limits applied to each shared container, checked, repaired; every refusal clear, logged
once, and the guard taking over; a container that is gone forgotten."""

from __future__ import annotations

import asyncio
import dataclasses
import os
from pathlib import Path

import pytest

from gpuslice.agent.caps import (
    CapsApplier,
    HookProgram,
    gpu_capabilities,
    has_sys_admin,
    live_cgroups,
    node_capability,
    resolve_cgroup,
)
from gpuslice.backends.simulated import SimulatedBackend
from gpuslice.backends.simulated.memory import Allocation
from gpuslice.backends.simulated.nodespec import parse_spec
from gpuslice.core.caps import (
    NOT_CONFIRMED_YET,
    CapPolicy,
    GpuCapability,
    GpuCaps,
    MemoryLimits,
    NodeCapability,
    caps_view,
    cgroup_candidates,
)
from gpuslice.core.config import parse_config
from gpuslice.core.guard.model import ContainerKey, Tenant
from gpuslice.core.protection import in_guard_view, node_protection
from gpuslice.core.sharing.model import Plan, SharingStrategy
from gpuslice.core.sharing.plan import build_plan
from gpuslice.core.units import MIB
from gpuslice.ports import ContainerDevices, MemoryLimitsError
from gpuslice.testing.logcapture import captured_events

ABLE = NodeCapability(cgroup_v2=True, root=True)
CONFIG = """version: v1
sharing:
  timeSlicing:
    resources:
    - name: nvidia.com/gpu
      replicas: 4
"""


def wanted_limits(
    held: list[ContainerDevices],
    plan: Plan,
    caps: dict[str, GpuCapability],
    policy: CapPolicy,
) -> dict[tuple[ContainerKey, str], MemoryLimits]:
    """What the caps loop applies (`agent.caps.CapsService.round`)."""
    return node_protection(plan, held, policy).limits(caps)


def uid(n: int) -> str:
    return f"{n:08x}-0000-4000-8000-{n:012x}"


def cid(n: int) -> str:
    return f"{n:02x}" * 32


def node(spec: str = "2xl40s", driver: str = "615.20") -> SimulatedBackend:
    return SimulatedBackend(
        dataclasses.replace(parse_spec(spec), driver_version=driver),
        cgroup_exists=os.path.isdir,
    )


def make_cgroup(root: Path, n: int, qos: str = "burstable") -> str:
    under = uid(n).replace("-", "_")
    path = (
        root / "kubepods.slice" / f"kubepods-{qos}.slice"
        / f"kubepods-{qos}-pod{under}.slice" / f"cri-containerd-{cid(n)}.scope"
    )  # fmt: skip
    path.mkdir(parents=True)
    return str(path)


def assignments(
    backend: SimulatedBackend, *holders: tuple[int, list[int]]
) -> list[ContainerDevices]:
    """Pod n holds replicas `idx` of GPU 0 (replica IDs `<uuid>::<i>`)."""
    gpu = backend.inventory().gpus[0].uuid
    return [
        ContainerDevices("ml", f"pod-{n}", "main", "nvidia.com/gpu",
                         tuple(f"{gpu}::{i}" for i in idx))
        for n, idx in holders
    ]  # fmt: skip


def key(n: int) -> ContainerKey:
    return ContainerKey("ml", f"pod-{n}", "main")


def test_resolve_finds_each_cgroup_form(tmp_path: Path) -> None:
    for n, qos in ((1, "burstable"), (2, "besteffort")):
        made = make_cgroup(tmp_path, n, qos)
        assert resolve_cgroup(tmp_path, uid(n), cid(n)) == made
    guaranteed = tmp_path / "kubepods" / f"pod{uid(3)}" / cid(3)
    guaranteed.mkdir(parents=True)
    assert resolve_cgroup(tmp_path, uid(3), cid(3)) == str(guaranteed)
    assert resolve_cgroup(tmp_path, uid(4), cid(4)) is None
    assert len(set(cgroup_candidates(uid(1), cid(1)))) == len(cgroup_candidates(uid(1), cid(1)))


def test_node_capability_reads_cgroup_v2_and_root(tmp_path: Path) -> None:
    (tmp_path / "kubepods.slice").mkdir()
    assert node_capability(tmp_path, euid=0, admin=True) == NodeCapability(
        cgroup_v2=False, root=True
    )
    (tmp_path / "cgroup.controllers").write_text("cpu memory\n")
    assert node_capability(tmp_path, euid=1000, admin=True) == NodeCapability(
        cgroup_v2=True, root=False
    )


def test_root_without_cap_sys_admin_is_not_root_to_the_driver(tmp_path: Path) -> None:
    """The chart's container runs as UID 0 with every capability dropped: the driver's
    privileged calls would fail, so the node is refused up front, saying why."""
    (tmp_path / "cgroup.controllers").write_text("cpu memory\n")
    (tmp_path / "kubepods.slice").mkdir()
    got = node_capability(tmp_path, euid=0, admin=False)
    assert got.refusal() == "not-root"
    status = tmp_path / "status"
    status.write_text("Name:\tx\nCapEff:\t00000000a80425fb\n")  # docker's default set
    assert has_sys_admin(status) is False
    status.write_text("Name:\tx\nCapEff:\t000001ffffffffff\n")
    assert has_sys_admin(status) is True


def test_a_cgroup_namespace_of_its_own_is_no_pod_cgroups(tmp_path: Path) -> None:
    """In a pod that does not mount the host's tree, /sys/fs/cgroup is the pod's own
    cgroup namespace: cgroup v2, but no pod's cgroup in it. Caps are refused with the reason,
    instead of a GPU reported capped while no container can be found."""
    (tmp_path / "cgroup.controllers").write_text("cpu memory\n")
    (tmp_path / "cgroup.procs").write_text("1\n")
    got = node_capability(tmp_path, euid=0, admin=True)
    assert got.refusal() == "no-pod-cgroups"
    b = node()
    caps = gpu_capabilities(b.inventory(), b, got, "auto")
    assert {c.reason for c in caps.values()} == {
        "pods' cgroups not found under --cgroup-root (mount the host's /sys/fs/cgroup there)"
    }
    for top in ("kubepods.slice", "kubepods", "kubelet.slice/kubelet-kubepods.slice"):
        root = tmp_path / top.replace("/", "_")
        (root / top).mkdir(parents=True)
        (root / "cgroup.controllers").write_text("cpu\n")
        assert node_capability(root, euid=0, admin=True).refusal() is None, top


def test_each_shared_container_gets_its_share_checked_and_repaired(tmp_path: Path) -> None:
    b = node()
    inv = b.inventory()
    caps = gpu_capabilities(inv, b, ABLE, "auto")
    assert all(c.capable for c in caps.values())
    plan = build_plan(inv, parse_config(CONFIG))
    share = inv.gpus[0].memory_mib * MIB // 4
    wanted = wanted_limits(assignments(b, (1, [0]), (2, [1, 2])), plan, caps, "strict")
    gpu = inv.gpus[0].uuid
    assert wanted == {
        (key(1), gpu): MemoryLimits(share, share),
        (key(2), gpu): MemoryLimits(2 * share, 2 * share),
    }
    paths = {n: make_cgroup(tmp_path, n) for n in (1, 2)}
    cgroups = live_cgroups(tmp_path, [(key(n), uid(n), cid(n)) for n in (1, 2)])
    applier = CapsApplier(b, caps, cgroup_root=tmp_path)
    first = applier.sync(wanted, cgroups)
    assert (first.set, first.ok, first.repaired) == (2, 0, 0)
    assert b.get_memory_limits(gpu, paths[2]).same_limits(MemoryLimits(2 * share, 2 * share))
    assert len(applier.windows_s) == 2
    assert all(0 <= w < 60 for w in applier.windows_s)
    # a neighbour (or a hook given another claim's pair) changed one: repaired
    b.set_memory_limits(gpu, paths[1], MemoryLimits(MIB, MIB))
    again = applier.sync(wanted, cgroups)
    assert (again.set, again.ok, again.repaired) == (0, 1, 1)
    assert b.get_memory_limits(gpu, paths[1]).same_limits(MemoryLimits(share, share))
    # currentUsed feeds the per-container metrics
    b.start_growing(41, gpu, Allocation(start_mib=700), cgroup=paths[1])
    applier.sync(wanted, cgroups)
    assert applier.readings()[(key(1), gpu)].used_bytes == 700 * MIB
    assert applier.capped() == {(key(1), gpu), (key(2), gpu)}


def test_a_container_that_is_gone_is_forgotten_quietly(tmp_path: Path) -> None:
    b = node()
    caps = gpu_capabilities(b.inventory(), b, ABLE, "auto")
    plan = build_plan(b.inventory(), parse_config(CONFIG))
    wanted = wanted_limits(assignments(b, (1, [0])), plan, caps, "strict")
    path = make_cgroup(tmp_path, 1)
    applier = CapsApplier(b, caps, cgroup_root=tmp_path)
    applier.sync(wanted, {key(1): path})
    os.rmdir(path)
    b.remove_cgroup(path)
    assert live_cgroups(tmp_path, [(key(1), uid(1), cid(1))]) == {}
    r = applier.sync(wanted, {key(1): path})  # a stale path: NVML's NOT_FOUND
    assert r.gone == 1
    assert r.refused == ()
    assert applier.capped() == frozenset()
    assert applier.capabilities[b.inventory().gpus[0].uuid].capable


def test_old_driver_mig_and_cgroup_v1_cap_nobody(tmp_path: Path) -> None:
    old = node(driver="580.95.05")
    caps = gpu_capabilities(old.inventory(), old, ABLE, "auto")
    assert {c.refusal for c in caps.values()} == {"driver-without-call"}
    mig = node("1xa100-40gb/mig=3g.20gb*2")
    assert {c.refusal for c in gpu_capabilities(mig.inventory(), mig, ABLE, "auto").values()} == {
        "mig"
    }
    v1 = NodeCapability(cgroup_v2=False, root=True)
    b = node()
    caps_v1 = gpu_capabilities(b.inventory(), b, v1, "auto")
    assert {c.refusal for c in caps_v1.values()} == {"cgroup-v1"}
    plan = build_plan(b.inventory(), parse_config(CONFIG))
    assert wanted_limits(assignments(b, (1, [0])), plan, caps_v1, "strict") == {}
    off = gpu_capabilities(b.inventory(), b, ABLE, "off")
    assert {c.refusal for c in off.values()} == {"caps-off"}


def test_an_nvml_error_is_retried_with_back_off_not_refused_for_life(tmp_path: Path) -> None:
    """An NVML error on one GPU used to take it out of caps for the agent's life. It is
    retried with back-off: meanwhile the GPU says why it is not capped, its containers stay
    in the guard's view, and once NVML answers again the limits are confirmed."""
    b = node()
    inv = b.inventory()
    gpu = inv.gpus[0].uuid
    caps = gpu_capabilities(inv, b, ABLE, "auto")
    plan = build_plan(inv, parse_config(CONFIG))
    path = make_cgroup(tmp_path, 1)
    now = [100.0]
    applier = CapsApplier(b, caps, cgroup_root=tmp_path, clock=lambda: now[0])
    wanted = wanted_limits(assignments(b, (1, [0])), plan, applier.capabilities, "strict")
    b.fail_memory_limits(gpu, "Unknown Error")
    with captured_events() as logs:
        for _ in range(3):
            applier.sync(wanted, {key(1): path})
    errors = [e for e in logs if e["event"] == "caps-nvml-error"]
    assert len(errors) == 1  # tried once; the next rounds wait out the back-off
    assert errors[0]["retry_in_s"] == 1.0
    assert applier.capabilities[gpu].capable  # not refused for life
    assert applier.capped() == frozenset()
    tenant = Tenant(key(1), gpu, SharingStrategy.TIME_SLICING, 1, 2)
    # the guard watches it meanwhile
    assert in_guard_view([tenant], applier.readings()) == (tenant,)
    assert "NVML failed" in applier.pending()[(key(1), gpu)]
    assert "NVML failed" in applier.gpu_states()[gpu].blocked
    now[0] += 1.0
    applier.sync(wanted, {key(1): path})  # still failing: the delay doubles
    assert applier.gpu_states()[gpu].blocked.endswith("retrying in 2 s")
    b.fail_memory_limits(gpu, None)
    applier.sync(wanted, {key(1): path})
    assert applier.capped() == frozenset()  # within the back-off: not asked yet
    now[0] += 2.0
    with captured_events() as logs:
        applier.sync(wanted, {key(1): path})
    assert applier.capped() == {(key(1), gpu)}
    assert applier.gpu_states()[gpu] == GpuCaps(confirmed_once=True, blocked="")
    assert applier.pending() == {}
    assert [e["event"] for e in logs if e["event"].startswith("caps-nvml")] == [
        "caps-nvml-recovered"
    ]


def test_the_hooks_view_leaves_out_a_gpu_whose_nvml_fails_until_a_retry_confirms(
    tmp_path: Path,
) -> None:
    """What Allocate and Prepare read (`hook_capabilities`): a GPU whose limit calls fail
    is `nvml-error` from the failure until a retry confirms limits there, even once nobody
    is left on it to retry (the hook would make the same call for the next container and
    fail it); the loop's own `capabilities` keep it capable, so it keeps retrying."""
    b = node()
    inv = b.inventory()
    gpu, other = inv.gpus[0].uuid, inv.gpus[1].uuid
    caps = gpu_capabilities(inv, b, ABLE, "auto")
    plan = build_plan(inv, parse_config(CONFIG))
    path = make_cgroup(tmp_path, 1)
    now = [100.0]
    applier = CapsApplier(b, caps, cgroup_root=tmp_path, clock=lambda: now[0])
    wanted = wanted_limits(assignments(b, (1, [0])), plan, applier.capabilities, "strict")
    applier.sync(wanted, {key(1): path})
    assert applier.hook_capabilities() == caps
    b.fail_memory_limits(gpu, "Unknown Error")
    applier.sync(wanted, {key(1): path})
    assert applier.hook_capabilities() == {
        gpu: GpuCapability(gpu, "nvml-error"),
        other: caps[other],
    }
    assert applier.capabilities[gpu].capable
    applier.sync({}, {})  # its container went: nothing left to retry there
    assert applier.gpu_states()[gpu].blocked == ""
    assert applier.hook_capabilities()[gpu].refusal == "nvml-error"
    b.fail_memory_limits(gpu, None)
    with captured_events() as logs:
        applier.sync(wanted, {key(1): path})  # a container there again: its limits confirm
    assert applier.hook_capabilities() == caps
    assert [e["event"] for e in logs if e["event"].startswith("caps-nvml")] == [
        "caps-nvml-recovered"
    ]


def test_a_driver_refusal_still_takes_the_gpu_out(tmp_path: Path) -> None:
    """What the driver states for good (no such call, a MIG handle) is not retried."""
    b = node()
    inv = b.inventory()
    gpu = inv.gpus[0].uuid
    caps = gpu_capabilities(inv, b, ABLE, "auto")
    plan = build_plan(inv, parse_config(CONFIG))
    path = make_cgroup(tmp_path, 1)
    applier = CapsApplier(b, caps, cgroup_root=tmp_path)
    wanted = wanted_limits(assignments(b, (1, [0])), plan, applier.capabilities, "strict")

    class _Old:
        def memory_limits_supported(self) -> bool:
            return True

        def get_memory_limits(self, gpu_uuid: str, cgroup_path: str) -> MemoryLimits:
            raise MemoryLimitsError("driver-without-call", "Function Not Found")

        def set_memory_limits(self, gpu_uuid: str, cgroup_path: str, limits: MemoryLimits) -> None:
            raise MemoryLimitsError("driver-without-call", "Function Not Found")

    applier = CapsApplier(_Old(), caps, cgroup_root=tmp_path)
    r = applier.sync(wanted, {key(1): path})
    assert r.refused == ((gpu, "driver-without-call"),)
    assert applier.capabilities[gpu].refusal == "driver-without-call"
    assert applier.hook_capabilities()[gpu].refusal == "driver-without-call"  # Allocate's view


def test_a_container_without_its_cgroup_says_so_and_the_gpu_is_not_capped(
    tmp_path: Path,
) -> None:
    b = node()
    inv = b.inventory()
    gpu = inv.gpus[0].uuid
    caps = gpu_capabilities(inv, b, ABLE, "auto")
    plan = build_plan(inv, parse_config(CONFIG))
    applier = CapsApplier(b, caps, cgroup_root=tmp_path)
    wanted = wanted_limits(assignments(b, (1, [0]), (2, [1])), plan, caps, "strict")
    applier.sync(wanted, {key(1): make_cgroup(tmp_path, 1)})
    assert applier.capped() == {(key(1), gpu)}
    assert applier.pending() == {(key(2), gpu): f"its cgroup was not found under {tmp_path}"}
    view = caps_view(
        applier.capabilities,
        "enforce",
        applier.readings(),
        gpus=applier.gpu_states(),
        pending=applier.pending(),
    )
    protection, reason = view.protection[gpu]
    assert protection == "guarded"
    assert reason == f"a container is not capped: its cgroup was not found under {tmp_path}"
    assert view.protection[inv.gpus[1].uuid] == ("guarded", NOT_CONFIRMED_YET)
    observed = caps_view(
        applier.capabilities, "observe", {}, gpus=applier.gpu_states(), pending=applier.pending()
    )
    assert observed.protection[gpu][0] == "none"  # an observing guard protects nobody
    cgroups = {key(1): str(resolve_cgroup(tmp_path, uid(1), cid(1))), key(2): ""}
    cgroups[key(2)] = make_cgroup(tmp_path, 2)
    applier.sync(wanted, cgroups)
    done = caps_view(
        applier.capabilities, "enforce", {}, gpus=applier.gpu_states(), pending=applier.pending()
    )
    assert done.protection[gpu] == ("capped", "")


def test_mps_and_whole_gpus_get_no_cap() -> None:
    b = node("2xl40s")
    inv = b.inventory()
    caps = gpu_capabilities(inv, b, ABLE, "auto")
    mps = parse_config(CONFIG.replace("timeSlicing", "mps"))
    plan = build_plan(inv, mps)
    assert wanted_limits(assignments(b, (1, [0])), plan, caps, "strict") == {}
    whole = build_plan(inv, parse_config(""))
    held = [ContainerDevices("ml", "pod-1", "main", "nvidia.com/gpu", (inv.gpus[0].uuid,))]
    assert wanted_limits(held, whole, caps, "strict") == {}


@pytest.mark.parametrize("policy", ["strict", "borrow"])
def test_policy_sets_the_hard_limit(policy: str) -> None:
    b = node()
    inv = b.inventory()
    caps = gpu_capabilities(inv, b, ABLE, "auto")
    plan = build_plan(inv, parse_config(CONFIG))
    held = assignments(b, (1, [0]))
    [(_pair, lim)] = wanted_limits(held, plan, caps, policy).items()  # type: ignore[arg-type]
    total = inv.gpus[0].memory_mib * MIB
    assert lim.hard_bytes == (total // 4 if policy == "strict" else total)


class _Kubelet:
    """PodResources' answer, as the kubelet emulator's books would give it."""

    def __init__(self, held: list[ContainerDevices]) -> None:
        self.held = held

    async def list_assignments(self) -> tuple[ContainerDevices, ...]:
        return tuple(self.held)


async def test_the_service_round_caps_what_the_pod_watch_shows(tmp_path: Path) -> None:
    from gpuslice.agent.caps import CapsService, pod_containers
    from gpuslice.k8s.pods import PodEntry

    b = node()
    inv = b.inventory()
    caps = gpu_capabilities(inv, b, ABLE, "auto")
    plan = build_plan(inv, parse_config(CONFIG))
    path = make_cgroup(tmp_path, 1)
    entries = [PodEntry(uid(1), "ml", "pod-1", ((cid(1), "main"),))]  # type: ignore[arg-type]
    service = CapsService(
        CapsApplier(b, caps, cgroup_root=tmp_path),
        policy="strict",
        current_plan=lambda: plan,
        assignments=_Kubelet(assignments(b, (1, [0]))),
        pods=lambda: pod_containers(entries),
        cgroup_root=tmp_path,
    )
    r = await service.round()
    assert r is not None
    assert r.set == 1
    share = inv.gpus[0].memory_mib * MIB // 4
    assert b.get_memory_limits(inv.gpus[0].uuid, path).same_limits(MemoryLimits(share, share))


async def test_a_node_without_capable_gpus_never_asks(tmp_path: Path) -> None:
    from gpuslice.agent.caps import CapsService

    b = node(driver="580.95.05")
    caps = gpu_capabilities(b.inventory(), b, ABLE, "auto")
    kubelet = _Kubelet([])
    service = CapsService(
        CapsApplier(b, caps, cgroup_root=tmp_path),
        policy="strict",
        current_plan=lambda: build_plan(b.inventory(), parse_config(CONFIG)),
        assignments=kubelet,
    )
    assert await service.round() is None
    stop = asyncio.Event()
    await service.run(stop)  # returns at once: nothing to do on this node
    assert service.rounds == 0
    assert b.memory_limit_calls == 0


def test_the_hook_is_written_only_where_it_can_work(tmp_path: Path) -> None:
    from gpuslice.agent.caps import cdi_hook

    hook = tmp_path / "nvidia-cdi-hook"
    assert cdi_hook(str(hook), "", ABLE, True) is None  # no program there
    hook.write_text("#!/bin/sh\n")
    assert cdi_hook(str(hook), "", ABLE, True) is None  # not executable: the pod would fail
    hook.chmod(0o755)
    got = cdi_hook(str(hook), "/run/nvidia/driver", ABLE, True)
    assert got is not None
    assert (got.hook_path, got.driver_root) == (str(hook), "/run/nvidia/driver")
    assert cdi_hook(str(hook), "", NodeCapability(cgroup_v2=False, root=True), True) is None
    assert cdi_hook(str(hook), "", ABLE, False) is None  # old driver, MIG: nothing to cap
    assert cdi_hook("", "", ABLE, True) is None  # turned off


def test_the_hook_program_is_checked_again_when_it_appears_or_goes(tmp_path: Path) -> None:
    """The toolkit installed after the agent started is used by the next Prepare, and one
    removed is no longer written (a hook that is not there fails the pod); each change is
    logged once. The program is looked for where the agent sees it (`seen_at`, the chart's
    mount of the host's directory) and written as the host's path."""
    seen = tmp_path / "host-bin"
    seen.mkdir()
    program = HookProgram(
        "/usr/bin/nvidia-cdi-hook", "", ABLE, True, seen_at=str(seen / "nvidia-cdi-hook")
    )
    with captured_events() as logs:
        assert program.cdi() is None
        assert program.cdi() is None
        (seen / "nvidia-cdi-hook").write_text("#!/bin/sh\n")
        (seen / "nvidia-cdi-hook").chmod(0o755)
        got = program.cdi()
        assert got is not None
        assert got.hook_path == "/usr/bin/nvidia-cdi-hook"
        assert program.cdi() is not None
        (seen / "nvidia-cdi-hook").unlink()
        assert program.cdi() is None
    assert [e["event"] for e in logs] == ["caps-hook-off", "caps-hook-on", "caps-hook-off"]
    assert logs[0]["then"] == "the agent applies the limits after the container starts"


def test_no_log_line_says_the_agent_applies_limits_where_it_does_not() -> None:
    """On a node that cannot take limits the agent applies none either: the hook's log line
    gives the reason and promises nothing."""
    with captured_events() as logs:
        assert HookProgram("/x", "", NodeCapability(cgroup_v2=False, root=True), True).cdi() is None
        assert HookProgram("/x", "", ABLE, False).cdi() is None
    assert [e["event"] for e in logs] == ["caps-hook-off", "caps-hook-off"]
    assert not any("then" in e for e in logs)
    assert logs[0]["reason"] == "the node runs cgroup v1; memory limits need cgroup v2"


def test_limits_a_hook_already_set_are_checked_and_count_no_window(tmp_path: Path) -> None:
    b = node()
    inv = b.inventory()
    caps = gpu_capabilities(inv, b, ABLE, "auto")
    plan = build_plan(inv, parse_config(CONFIG))
    wanted = wanted_limits(assignments(b, (1, [0])), plan, caps, "strict")
    path = make_cgroup(tmp_path, 1)
    [(_, limits)] = wanted.items()
    b.set_memory_limits(inv.gpus[0].uuid, path, limits)  # as the hook would, at createRuntime
    applier = CapsApplier(b, caps, cgroup_root=tmp_path)
    r = applier.sync(wanted, {key(1): path})
    assert (r.ok, r.set, r.repaired) == (1, 0, 0)
    assert applier.windows_s == []
    assert applier.capped() == {(key(1), inv.gpus[0].uuid)}


def test_a_request_above_the_limit_is_never_sent_and_told_once(tmp_path: Path) -> None:
    b = node()
    gpu = b.inventory().gpus[0].uuid
    caps = gpu_capabilities(b.inventory(), b, ABLE, "auto")
    applier = CapsApplier(b, caps, cgroup_root=tmp_path)
    path = make_cgroup(tmp_path, 1)
    calls = b.memory_limit_calls
    with captured_events() as logs:
        for _ in range(2):
            applier.sync({(key(1), gpu): MemoryLimits(2 * MIB, MIB)}, {key(1): path})
    assert b.memory_limit_calls == calls
    assert [e["event"] for e in logs] == ["caps-request-above-limit"]
    assert applier.capped() == frozenset()


async def test_a_share_claims_memory_is_divided_among_the_pods_that_use_it(tmp_path: Path) -> None:
    """The caps loop over a claims plan: one claim on a 12 GiB share of an L40S used by one
    pod, then three, then one again. Its pods' limits together never exceed the claim's:
    12 GiB, then 4 GiB each (repaired in place), then 12 GiB again (issue 40, item 5)."""
    from gpuslice.agent.caps import CapsService, pod_containers
    from gpuslice.core.cgroups import ContainerId, PodUid
    from gpuslice.core.dra.claimplan import claims_plan
    from gpuslice.core.dra.prepared import DeviceUse, PreparedClaim
    from gpuslice.k8s.pods import PodEntry

    b = node("1xl40s")
    inv = b.inventory()
    gpu = inv.gpus[0].uuid
    caps = gpu_capabilities(inv, b, ABLE, "auto")
    use = DeviceUse("gpu-0", gpu, SharingStrategy.TIME_SLICING, 4, "s1", 12288)
    claim = PreparedClaim("uid-1", "ml", "team", "PrepareCompleted", uses=(use,))
    plan = claims_plan([claim], inv, "node")
    paths = {n: make_cgroup(tmp_path, n) for n in (1, 2, 3)}
    entries = [
        PodEntry(PodUid(uid(n)), "ml", f"pod-{n}", ((ContainerId(cid(n)), "main"),))
        for n in (1, 2, 3)
    ]
    kubelet = _Kubelet([])
    service = CapsService(
        CapsApplier(b, caps, cgroup_root=tmp_path),
        policy="strict",
        current_plan=lambda: plan,
        assignments=kubelet,
        pods=lambda: pod_containers(entries),
        cgroup_root=tmp_path,
    )

    def use_claim(*pods: int) -> None:
        kubelet.held = [
            ContainerDevices("ml", f"pod-{n}", "main", "claim:ml/team", ("node/gpu-0/s1",))
            for n in pods
        ]

    def hard(n: int) -> int:
        return b.get_memory_limits(gpu, paths[n]).hard_bytes // MIB

    use_claim(1)
    await service.round()
    assert hard(1) == 12288
    use_claim(1, 2, 3)
    r = await service.round()
    assert r is not None
    assert (r.set, r.repaired) == (2, 1)
    assert [hard(n) for n in (1, 2, 3)] == [4096, 4096, 4096]
    use_claim(1)
    r = await service.round()
    assert r is not None
    assert r.repaired == 1
    assert hard(1) == 12288


def test_a_tenants_own_limit_above_its_share_is_told_and_set_back(tmp_path: Path) -> None:
    """A pod's own `NVIDIA_GPU_MEMORY_LIMIT` wins over Allocate's in its env (measured on
    containerd: tests/real_node/test_tenant_env_on_a_real_node.py), and the toolkit's hook
    applies it at createRuntime: the read-back finds it above the share, says whose doing
    it is, and sets the share again; until then the guard watches the container."""
    b = node()
    inv = b.inventory()
    gpu = inv.gpus[0].uuid
    caps = gpu_capabilities(inv, b, ABLE, "auto")
    plan = build_plan(inv, parse_config(CONFIG))
    wanted = wanted_limits(assignments(b, (1, [0])), plan, caps, "strict")
    [(_, share)] = wanted.items()
    path = make_cgroup(tmp_path, 1)
    whole = inv.gpus[0].memory_mib * MIB
    b.set_memory_limits(gpu, path, MemoryLimits(whole, whole))  # the tenant's own, by the hook
    applier = CapsApplier(b, caps, cgroup_root=tmp_path)
    tenant = Tenant(key(1), gpu, SharingStrategy.TIME_SLICING, share.soft_bytes, whole)
    assert in_guard_view([tenant], applier.readings()) == (tenant,)
    with captured_events() as logs:
        r = applier.sync(wanted, {key(1): path})
    assert (r.raised, r.repaired, r.set) == (1, 0, 0)
    assert b.get_memory_limits(gpu, path).same_limits(share)
    [told] = [e for e in logs if e["event"] == "caps-limit-raised"]
    assert (told["container"], told["found"]) == (str(key(1)), str(MemoryLimits(whole, whole)))
    assert [e["outcome"] for e in logs if e["event"] == "caps-applied"] == ["raised"]
    # a lower one (another claim's pair given by a hook) is only repaired, not a tenant's doing
    b.set_memory_limits(gpu, path, MemoryLimits(MIB, MIB))
    assert applier.sync(wanted, {key(1): path}).repaired == 1
