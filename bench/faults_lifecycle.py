#!/usr/bin/env python3
"""Lifecycle events of the agent on a node with work in place, and what each one loses.

Every case runs real `gpuslice plugin` processes (`gpuslice.testing.daemon.DaemonProcess`)
on a simulated node in a temp directory, with the fake MPS control program, the kubelet
emulators and the Kubernetes API double, the way `faults_claims.py` and `tests/e2e_dra` do.
Before the event the node has work on it: DRA claims prepared through the kubelet emulator
(two with an MPS GpuConfig, so two claim MPS daemons, one plain), or, in device-plugin
mode, an MPS config with two pods admitted (the daemon's clients). After the event it
counts what was lost (the goal of every column is 0):

- lost CDI specs / lost records: claims still running whose CDI spec file, or whose entry in
  `gpuslice-checkpoint.json`, is gone (a pod whose spec is gone cannot restart its
  containers; a claim without a record is never undone);
- daemons replaced: MPS control daemons of running claims or pods whose pid changed, that
  died, or that no longer answer (their clients were cut off);
- MPS dirs left: claim MPS directories still there after every claim was unprepared;
- extra registrations: registrations the kubelet emulator accepted beyond one per agent
  start that should register (two agents fighting over a socket register in a loop);
- left behind: what the event left on the node that neither the config nor any claim wants
  any more: an MPS daemon still running, a GPU still in EXCLUSIVE_PROCESS, a MIG instance
  gpuslice made that nothing will destroy (the instance of a claim unprepared at the end).

The cases, each on a node of its own:

- upgrade: the record under the name an older build wrote (`checkpoint.json`) at start;
- checkpoint removed: no record at start, claims prepared;
- API-less start: a corrupt record while the API is unreachable (one row), then the next
  start with the API back (a second row: what the first start wrote is what it trusts);
- two agents (DRA): a second agent starts while the first lingers (a force-deleted pod),
  a claim is prepared through whichever the kubelet reaches, then the first one exits;
- two agents (device plugin): the same on one device-plugin socket with MPS;
- SIGKILL (DRA, MPS claims): the agent killed and started again, nothing else (the control:
  DRA mode leaves claim daemons running for the next agent by design);
- SIGKILL / SIGTERM (device plugin, MPS, two pods admitted): the agent ends and starts again;
- reboot: the agent and every MPS daemon killed, the record's boot ID changed (the agent
  reads the real one, so a record from "another boot" is what a reboot leaves), pid files
  left behind; the kubelet then prepares one MPS claim and the plain one again (their
  pods restart) and unprepares the other MPS claim (its pod is gone);
- restart into another config (device plugin, MPS, compute modes set; issue 41 item 1):
  the agent stopped and started on a config without MPS (time-slicing), or with the MPS
  resource renamed: the old daemon and the GPU's EXCLUSIVE_PROCESS are left behind unless
  the new agent undoes them before it advertises;
- crash mid-Prepare (DRA, compute modes set; item 2): the agent SIGKILLed inside an MPS
  claim's Prepare, after EXCLUSIVE_PROCESS and before the daemon answered, and started
  again; the claims in place must lose nothing, the cut one must leave nothing;
- rollback (item 3): an API-less start over a corrupt record, then the previous release's
  own agent (`git archive` of `PREVIOUS_RELEASE`) with the API back;
- dynamic MIG record lost (item 4, in-process drivers: a simulated GPU lives in its
  process): the record removed while a claim is prepared, or the agent killed while it
  writes the rebuild of a corrupt one; then the claim is unprepared.

And what already holds, kept in view: 3,000 Prepare/Unprepare cycles (`--quick`: 300) with
the agent's file descriptors, threads and RSS flat (end against start after a warm-up), and
a kubelet restart while a Prepare waits on its MPS daemon, undone cleanly (nothing left,
the retry succeeds).

    PYTHONPATH=src .venv/bin/python bench/faults_lifecycle.py [--quick] [--require-nothing-lost]

`--require-nothing-lost` exits 1 when any case lost anything or what holds no longer does:
the check for the day every lifecycle fix is in. `bench_faults.py --lifecycle` runs it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from faults_claims import DRIVER, MPS, DraNode, dra_agent, dra_node, timed_cycle

from gpuslice.aio.programs import ProgramError as MpsError
from gpuslice.aio.sockets import SocketId, socket_identity
from gpuslice.core.dra.claims import claim_daemon_key
from gpuslice.core.dra.kubelet_api import ClaimRef
from gpuslice.core.dra.prepared import Checkpoint, decode, encode
from gpuslice.emulator.dra_kubelet import DraKubeletEmulator, DraKubeletError, DraRegistration
from gpuslice.emulator.kubelet import KubeletEmulator
from gpuslice.host.checkpoint_file import CHECKPOINT_NAME
from gpuslice.mps.control import PID_FILE, ControlProgram, process_alive
from gpuslice.mps.manager import HEALTH_COMMAND
from gpuslice.testing.daemon import DaemonProcess
from gpuslice.testing.envtest import free_port

DRA_SPEC = "sim:8xh100-80gb"
"""Room for the three claims in place and the ones a case prepares during its event."""
OLD_CHECKPOINT_NAME = "checkpoint.json"
"""What builds before the rename wrote (`host.checkpoint_file.CHECKPOINT_NAME`'s note)."""
FAKE_MPS = (sys.executable, "-m", "gpuslice.emulator.fake_mps_control")
DP_RES = "nvidia.com/gpu"
DP_REPLICAS = 4
WAIT_S = 60.0
SETTLE_S = 1.5
"""After an agent is back: time for a registration loop or a late cleanup to show."""
DIRS_S = 3.0
"""Grace for MPS directories to go after the last Unprepare answered."""
FIGHT_S = 4.0
"""How long two agents run side by side before the first one exits."""
OVERLAP_WAIT_S = 15.0
"""How long a second agent is given to register while the first still runs, unless it says
first that it waits for the node's lock (`WAITING`): then the two-agent cases let the
first exit."""
WAITING = "event=node-lock-busy"
"""The line a second agent logs when another holds the node (`agent.node_lock`)."""


# -- what a case reports ----------------------------------------------------------------------


@dataclass
class Row:
    """One case's losses; None where a column does not apply (device plugin: no CDI specs,
    no record) or could not be measured (said in the note)."""

    case: str
    claims: int
    lost_specs: int | None = None
    lost_records: int | None = None
    replaced: int | None = None
    dirs_left: int | None = None
    extra_registrations: int | None = None
    left: int | None = None
    notes: list[str] = field(default_factory=list)
    failed: bool = False
    """Something went wrong besides a loss (an agent that never came back, a failed call):
    the row's zeros then prove nothing, so the case does not count as losing nothing."""

    def fail(self, note: str) -> None:
        self.failed = True
        self.notes.append(f"FAILED: {note}")

    @property
    def clean(self) -> bool:
        return self.lost == 0 and not self.failed

    @property
    def lost(self) -> int:
        counts = (
            self.lost_specs,
            self.lost_records,
            self.replaced,
            self.dirs_left,
            self.extra_registrations,
            self.left,
        )
        return sum(c for c in counts if c is not None)


@dataclass
class Holds:
    """What already holds: the soak's resource ends against its starts, and the undo of a
    Prepare cut by a kubelet restart."""

    cycles: int = 0
    fds: tuple[int, int] = (0, 0)
    threads: tuple[int, int] = (0, 0)
    rss_kib: tuple[int, int] = (1, 1)
    cycle_s: float = 0.0
    restart_left: tuple[int, int, int, int] = (0, 0, 0, 0)
    restart_undo_s: float = 0.0
    restart_outcome: str = ""
    retry: str = ""

    @property
    def rss_x(self) -> float:
        return self.rss_kib[1] / self.rss_kib[0]

    @property
    def flat(self) -> bool:
        """Flat: at most 2 more descriptors and threads (a connection, a worker being
        replaced) and RSS within 10 % (the allocator's arenas), after the warm-up."""
        return (
            self.fds[1] - self.fds[0] <= 2
            and self.threads[1] - self.threads[0] <= 2
            and self.rss_x <= 1.10
        )

    @property
    def undone(self) -> bool:
        return self.restart_left == (0, 0, 0, 0) and self.retry == "succeeded"


# -- DRA: claims in place, the agent restarted, what is left -----------------------------------


@dataclass
class Held:
    """A claim prepared before the event; `pipe` and `pid` for an MPS claim's daemon."""

    ref: ClaimRef
    pipe: Path | None = None
    pid: int = 0


def _read_pid(pipe: Path) -> int:
    try:
        return int((pipe / PID_FILE).read_text().strip())
    except (OSError, ValueError):
        return 0


def _pid_written(pipe: Path) -> Callable[[], bool]:
    return lambda: _read_pid(pipe) != 0


async def answers(pipe: Path) -> bool:
    """Whether the daemon in `pipe` answers its health command, asked the way the agent
    asks it (`ControlProgram` over the fake control program)."""
    control = ControlProgram(pipe, pipe.parent / "log", command=FAKE_MPS, timeout_s=5.0)
    try:
        float((await control.send(HEALTH_COMMAND)).strip())
    except (MpsError, ValueError):
        return False
    return True


async def place(node: DraNode, names: list[tuple[str, str, bool]]) -> list[Held]:
    """Claims `(name, device, mps)` allocated and prepared in one kubelet call, as a pod's."""
    mps = [{"opaque": {"driver": DRIVER, "parameters": MPS}}]
    refs = [node.claim(name, device, mps if with_mps else None) for name, device, with_mps in names]
    results = await node.kubelet.prepare(DRIVER, refs)
    held = []
    for ref, (_, _, with_mps) in zip(refs, names, strict=True):
        if results[ref.uid].error:
            raise SystemExit(f"Prepare of {ref.name} failed: {results[ref.uid].error}")
        if not with_mps:
            held.append(Held(ref))
            continue
        pipe = next((node.plugin_dir / "mps").glob(f"{ref.uid}-*/pipe"))
        await node.until(_pid_written(pipe), f"{ref.name}'s daemon")
        held.append(Held(ref, pipe, _read_pid(pipe)))
    return held


IN_PLACE = [("mps-0", "gpu-0", True), ("mps-1", "gpu-1", True), ("plain-2", "gpu-2", False)]


def recorded(node: DraNode) -> set[str]:
    """Claim UIDs in the record under its current name; none when it is missing or unusable."""
    try:
        return set(node.recorded())
    except (OSError, ValueError, KeyError, TypeError):
        return set()


def lost_files(node: DraNode, held: list[Held]) -> tuple[int, int]:
    """(CDI specs, records) of `held` that are gone."""
    specs = {p.name for p in node.cdi_specs()}
    records = recorded(node)
    no_spec = sum(1 for h in held if not any(h.ref.uid in s for s in specs))
    return no_spec, sum(1 for h in held if h.ref.uid not in records)


async def replaced(held: list[Held]) -> int:
    """MPS daemons of `held` that died, changed pid, or stopped answering."""
    count = 0
    for h in held:
        if h.pipe is None:
            continue
        same = _read_pid(h.pipe) == h.pid and process_alive(h.pid)
        count += not (same and await answers(h.pipe))
    return count


def mps_dirs(node: DraNode) -> list[Path]:
    root = node.plugin_dir / "mps"
    return sorted(p for p in root.iterdir() if (p / "pipe").is_dir()) if root.is_dir() else []


async def unprepare_all(
    node: DraNode, held: list[Held], row: Row, *, exit_within_s: float = 0.0
) -> None:
    """The pods end: every claim unprepared; the claim MPS directories left are counted.

    `exit_within_s`: how long a claim's daemon may take to end once its Unprepare answered.
    None (0) for this code, which answers only once a daemon it stops (its own, or one it took
    over and pinned) has ended; an older release only asks a daemon it took over to quit,
    so the daemon ends a moment after the answer (longer on a loaded machine)."""
    if node.kubelet.registration(DRIVER) is None:
        row.fail("driver not registered at the end: nothing could be unprepared")
        return
    errors = await node.kubelet.unprepare(DRIVER, [h.ref for h in held])
    failed = [e for e in errors.values() if e]
    if failed:
        row.fail(f"{len(failed)} Unprepares failed: {failed[0][:80]}")
    for _ in range(int(DIRS_S / 0.05)):  # Unprepare removes them before it answers
        if not mps_dirs(node):
            break
        await asyncio.sleep(0.05)
    row.dirs_left = len(mps_dirs(node))

    def alive() -> int:
        return sum(1 for h in held if h.pid and process_alive(h.pid))

    for _ in range(int(exit_within_s / 0.05)):
        if not alive():
            break
        await asyncio.sleep(0.05)
    alive_now = alive()
    if alive_now:
        row.fail(f"{alive_now} MPS daemons still running after Unprepare")


class Registrations:
    """Registrations the DRA kubelet emulator accepts, counted by watching its current
    registration change (a new object per accepted registration; the emulator keeps no
    count of its own), every 10 ms, and only for a registration socket not counted before
    (`aio.sockets.socket_identity`: device, inode, ctime). So a socket the emulator
    happens to register twice (it scanned an agent's stale socket while the new agent put
    its own in place: a race of the emulator's, seen once in six reboots) counts once, while
    agents re-creating their sockets against each other count every time."""

    def __init__(self, kubelet: DraKubeletEmulator) -> None:
        self._kubelet = kubelet
        self.count = 0
        self._last: DraRegistration | None = kubelet.registration(DRIVER)
        self._counted: SocketId | None = (
            None if self._last is None else socket_identity(self._last.registration_socket)
        )
        self._task: asyncio.Task[None] | None = None

    async def _poll(self) -> None:
        while True:
            current = self._kubelet.registration(DRIVER)
            if current is not None and current is not self._last:
                self._last = current
                identity = socket_identity(current.registration_socket)
                if identity is None or identity != self._counted:
                    self.count += 1
                    self._counted = identity
            await asyncio.sleep(0.01)

    def __enter__(self) -> Registrations:
        self._task = asyncio.get_running_loop().create_task(self._poll())
        return self

    def __exit__(self, *exc: object) -> None:
        if self._task is not None:
            self._task.cancel()


def dead_kubeconfig(node: DraNode) -> Path:
    """A kubeconfig naming a loopback port nobody listens on: the API unreachable."""
    doc = node.api.kubeconfig()
    doc["clusters"][0]["cluster"]["server"] = f"http://127.0.0.1:{free_port()}"
    path = node.root / "kubeconfig-dead"
    path.write_text(yaml.safe_dump(doc), encoding="utf-8")
    return path


async def start_agent(
    node: DraNode,
    log_name: str,
    kubeconfig: Path | None = None,
    within_s: float = WAIT_S,
    *,
    nvidia_smi: Path | None = None,
    code: Path | None = None,
) -> bool:
    """Start a new agent process for the node (it replaces `node.daemon`) and wait until it
    loaded its record and, with the API up, registered anew; False if it did not within
    `within_s` (or exited). `nvidia_smi`: it sets compute modes through that; `code`: the
    `src` tree it runs (another release's), instead of this one."""
    before = node.kubelet.registration(DRIVER)
    kube = kubeconfig or node.root / "kubeconfig"
    node.daemon = dra_agent(node.root, kube, DRA_SPEC, log_name, nvidia_smi)
    if code is not None:
        node.daemon.env = {**node.daemon.env, "PYTHONPATH": str(code)}
    await node.daemon.start()
    try:
        loaded = "dra-checkpoint-loaded"
        await node.until(
            lambda: loaded in node.daemon.log() or WAITING in node.daemon.log(),
            "record loaded",
            within_s,
        )
        if loaded not in node.daemon.log():
            return False  # it waits for the node's lock: it acts only once the first exits
        if kubeconfig is None:
            await node.until(
                lambda: (
                    (now := node.kubelet.registration(DRIVER)) is not None and now is not before
                ),
                "registration",
                within_s,
            )
    except SystemExit:
        return False
    await asyncio.sleep(SETTLE_S)
    return True


async def measure(node: DraNode, held: list[Held], row: Row) -> None:
    row.lost_specs, row.lost_records = lost_files(node, held)
    row.replaced = await replaced(held)
    if 0 < (row.lost_specs or 0) < len(held):  # which ones, when it is not all of them
        specs = {p.name for p in node.cdi_specs()}
        gone = [h.ref.name for h in held if not any(h.ref.uid in s for s in specs)]
        row.notes.append(f"CDI spec gone: {', '.join(gone)}")
    if not node.daemon.running:
        row.fail(f"agent exited ({node.daemon.proc and node.daemon.proc.returncode})")


async def restart_case(
    case: str, between: Callable[[DraNode], None], *, sigkill: bool = False
) -> Row:
    """Claims in place, the agent stopped (SIGTERM, or SIGKILL), `between` done to its
    files, a new agent started."""
    async with dra_node(node_spec=DRA_SPEC) as node:
        held = await place(node, IN_PLACE)
        row = Row(case, len(held))
        with Registrations(node.kubelet) as regs:
            if sigkill:
                assert node.daemon.proc is not None
                node.daemon.proc.kill()
                await node.daemon.proc.wait()
            else:
                await node.daemon.terminate()
            between(node)
            if not await start_agent(node, "agent-2.log"):
                row.fail("the agent did not come back")
            await measure(node, held, row)
            await unprepare_all(node, held, row)
            row.extra_registrations = regs.count - 1
        return row


def to_old_name(node: DraNode) -> None:
    (node.plugin_dir / CHECKPOINT_NAME).rename(node.plugin_dir / OLD_CHECKPOINT_NAME)


def removed(node: DraNode) -> None:
    (node.plugin_dir / CHECKPOINT_NAME).unlink()


def untouched(node: DraNode) -> None:
    """Nothing done to the node's files: the restart alone."""


async def case_dra_sigkill() -> list[Row]:
    """The control: DRA mode keeps claim daemons across agent restarts by design."""
    return [await restart_case("SIGKILL (DRA, MPS claims)", untouched, sigkill=True)]


async def case_upgrade() -> list[Row]:
    return [await restart_case(f"upgrade (record as {OLD_CHECKPOINT_NAME})", to_old_name)]


async def case_removed() -> list[Row]:
    return [await restart_case("checkpoint removed", removed)]


async def case_api_less() -> list[Row]:
    """A corrupt record met with the API unreachable, then the next start with it back."""
    async with dra_node(node_spec=DRA_SPEC) as node:
        held = await place(node, IN_PLACE)
        first = Row("API-less start, corrupt record", len(held))
        second = Row("  then restart, API back", len(held))
        with Registrations(node.kubelet) as regs:
            await node.daemon.terminate()
            path = node.plugin_dir / CHECKPOINT_NAME
            path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])  # truncated
            if not await start_agent(node, "agent-2.log", dead_kubeconfig(node)):
                first.fail("the agent did not load its record")
            await measure(node, held, first)
            # without the API the record cannot be rebuilt yet: not counted here; what it
            # holds now is what the next start (the second row) goes by
            first.notes.append(
                f"record holds {len(held) - (first.lost_records or 0)} of "
                f"{len(held)}; " + ("registered" if node.kubelet.registration(DRIVER) else
                                    "not registered")
            )  # fmt: skip
            first.lost_records = None
            first.extra_registrations = max(0, regs.count - 1)
            await node.daemon.terminate()
            seen = regs.count
            if not await start_agent(node, "agent-3.log"):
                second.fail("the agent did not come back")
            await measure(node, held, second)
            await unprepare_all(node, held, second)
            second.extra_registrations = regs.count - seen - 1
        return [first, second]


async def case_two_dra_agents() -> list[Row]:
    """A force-deleted pod's agent (A) lingers while its replacement (B) starts and serves a
    new claim; B's container then restarts (B2). Between B's exit and B2's start the kubelet
    prepares one more claim through whichever agent it reaches; then A finally exits. Three
    registrations are right (B, B2, and none for A); a record or CDI spec of either new
    claim gone is what a stale agent writing over B's record costs."""
    async with dra_node(node_spec=DRA_SPEC) as node:
        held = await place(node, IN_PLACE)
        row = Row("two agents (DRA)", len(held) + 2)
        lingering = node.daemon
        with Registrations(node.kubelet) as regs:
            if not await start_agent(node, "agent-b.log", within_s=OVERLAP_WAIT_S):
                # a fix may make B wait for A: then A's exit lets it go on
                row.notes.append("the second agent waited for the first")
                await lingering.terminate()
                await node.until(lambda: node.kubelet.registration(DRIVER) is not None, "B")
            held += await place(node, [("during-3", "gpu-3", False)])
            await node.daemon.terminate()  # B's container restarts
            await asyncio.sleep(SETTLE_S)
            late = [("after-4", "gpu-4", False)]
            try:
                held += await place(node, late)
                row.notes.append("a Prepare between B's exit and B2's start was answered")
            except (SystemExit, DraKubeletError):
                late_pending = True
            else:
                late_pending = False
            if not await start_agent(node, "agent-b2.log"):
                row.fail("B2 never registered")
            if late_pending:  # the kubelet retries the pod's Prepare
                held += await place(node, late)
            await lingering.terminate()  # the force-deleted pod's process finally ends
            await asyncio.sleep(SETTLE_S)
            await measure(node, held, row)
            await unprepare_all(node, held, row)
            row.extra_registrations = regs.count - 2
        return [row]


def reboot_record(node: DraNode) -> None:
    """The record as a reboot leaves it: written under another boot ID."""
    path = node.plugin_dir / CHECKPOINT_NAME
    claims = dict(decode(path.read_bytes(), "").checkpoint.claims)
    path.write_bytes(encode(Checkpoint("bench-boot-before-the-reboot", claims)))


async def case_reboot() -> list[Row]:
    """Everything killed, the record from another boot, pid files left; the kubelet then
    prepares two claims again and unprepares the third (its pod is gone)."""
    async with dra_node(node_spec=DRA_SPEC) as node:
        held = await place(node, IN_PLACE)
        row = Row("reboot (new boot ID)", len(held))
        with Registrations(node.kubelet) as regs:
            assert node.daemon.proc is not None
            node.daemon.proc.kill()
            await node.daemon.proc.wait()
            for h in held:
                if h.pid:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(h.pid, signal.SIGKILL)
            for _ in range(500):  # the agent is down: `node.until` would give up at once
                if not any(process_alive(h.pid) for h in held if h.pid):
                    break
                await asyncio.sleep(0.01)
            reboot_record(node)
            await node.kubelet.restart()
            if not await start_agent(node, "agent-2.log"):
                row.fail("the agent did not come back")
            again, gone = [held[0], held[2]], held[1]
            results = await node.kubelet.prepare(DRIVER, [h.ref for h in again])
            failed = [r.error for r in results.values() if r.error]
            if failed:
                row.fail(f"{len(failed)} Prepares after the reboot failed: {failed[0][:80]}")
            errors = await node.kubelet.unprepare(DRIVER, [gone.ref])
            if errors[gone.ref.uid]:
                row.fail(f"Unprepare of the gone claim failed: {errors[gone.ref.uid][:80]}")
            await asyncio.sleep(SETTLE_S)
            assert gone.pipe is not None
            if gone.pipe.parent.exists():
                row.notes.append("the gone claim's MPS directory kept")
            row.lost_specs, row.lost_records = lost_files(node, again)
            # its daemon is new after a reboot (the old one died with it): it must answer
            mps_again = held[0]
            assert mps_again.pipe is not None
            row.replaced = 0 if await answers(mps_again.pipe) else 1
            await unprepare_all(node, held, row)
            row.extra_registrations = regs.count - 1
        return [row]


# -- device plugin with MPS: pods admitted, the agent ended and started -------------------------


@dataclass
class DpNode:
    root: Path
    kubelet: KubeletEmulator
    daemon: DaemonProcess
    starts: int = 1
    nvidia_smi: Path | None = None

    @property
    def pipe(self) -> Path:
        return self.root / "mps" / DP_RES / "pipe"

    def agent(self) -> DaemonProcess:
        self.starts += 1
        return dp_agent(self.root, f"agent-{self.starts}.log", self.nvidia_smi)

    async def until(self, predicate: Callable[[], bool], within_s: float = WAIT_S) -> bool:
        try:
            await self.kubelet.wait_for(predicate, within_s)
        except TimeoutError:
            return False
        return True


def dp_agent(root: Path, log_name: str, nvidia_smi: Path | None = None) -> DaemonProcess:
    """The device-plugin agent with MPS, as `tests/e2e/test_mps.py` starts it; setting
    compute modes through `nvidia_smi` when given."""
    modes = ["--nvidia-smi", str(nvidia_smi)] if nvidia_smi else ["--no-compute-mode"]
    return DaemonProcess(
        [
            "--node", "sim:1xl40s", "--config-file", str(root / "config.yaml"),
            "--device-plugin-path", str(root / "dp"), *modes,
            "--mps-control", " ".join(FAKE_MPS), "--mps-root", str(root / "mps"),
            "--mps-health-interval", "0.5", "--no-labels",
        ],
        log_path=root / log_name,
        env={"GPUSLICE_SIM_CONTROL_DIR": str(root / "ctl")},
    )  # fmt: skip


@contextlib.asynccontextmanager
async def dp_node(compute_modes: bool = False) -> AsyncIterator[DpNode]:
    """`compute_modes`: the agents set them, through a recording `nvidia-smi`."""
    root = Path(tempfile.mkdtemp(prefix="gsl-", dir="/tmp"))
    (root / "dp").mkdir()
    smi = recording_smi(root) if compute_modes else None
    (root / "config.yaml").write_text(
        "version: v1\nsharing:\n  mps:\n    resources:\n"
        f"    - name: {DP_RES}\n      replicas: {DP_REPLICAS}\n",
        encoding="utf-8",
    )
    kubelet = KubeletEmulator(root / "dp")
    await kubelet.start()
    node = DpNode(root, kubelet, dp_agent(root, "agent-1.log", smi), nvidia_smi=smi)
    await node.daemon.start()
    try:
        if not await node.until(lambda: kubelet.allocatable(DP_RES) == DP_REPLICAS):
            raise SystemExit(f"the MPS agent never got ready:\n{node.daemon.log()[-4000:]}")
        yield node
    finally:
        await node.daemon.terminate()
        await kubelet.stop()
        shutil.rmtree(root, ignore_errors=True)


async def dp_case(case: str, event: Callable[[DpNode], Awaitable[int]]) -> list[Row]:
    """Two pods admitted (the MPS daemon's clients); `event` returns how many registrations
    the agent starts it made should have caused; then the daemon is checked."""
    async with dp_node() as node:
        for i in range(2):
            await node.kubelet.admit("default", f"client-{i}", [("main", {DP_RES: 1})])
        pid = _read_pid(node.pipe)
        row = Row(case, 2)
        before = node.kubelet.registrations[DP_RES]
        expected = await event(node)
        if not await node.until(lambda: node.kubelet.allocatable(DP_RES) == DP_REPLICAS):
            row.fail("replicas never allocatable again")
        await asyncio.sleep(SETTLE_S)
        same = _read_pid(node.pipe) == pid and process_alive(pid)
        row.replaced = int(not (same and await answers(node.pipe)))
        row.extra_registrations = node.kubelet.registrations[DP_RES] - before - expected
        if not node.daemon.running:
            row.fail("the agent is not running at the end")
        return [row]


async def _restarted(node: DpNode, end: Callable[[DaemonProcess], Awaitable[object]]) -> int:
    before = node.kubelet.registrations[DP_RES]
    await end(node.daemon)
    node.daemon = node.agent()
    await node.daemon.start()
    await node.until(lambda: node.kubelet.registrations[DP_RES] > before)
    return 1


async def _sigkill(daemon: DaemonProcess) -> None:
    assert daemon.proc is not None
    daemon.proc.kill()
    await daemon.proc.wait()


async def case_dp_sigkill() -> list[Row]:
    return await dp_case("SIGKILL (device plugin, MPS)", lambda n: _restarted(n, _sigkill))


async def case_dp_sigterm() -> list[Row]:
    return await dp_case(
        "SIGTERM (device plugin, MPS)", lambda n: _restarted(n, lambda d: d.terminate())
    )


async def _second_dp_agent(node: DpNode) -> int:
    first = node.daemon
    before = node.kubelet.registrations[DP_RES]
    node.daemon = node.agent()
    await node.daemon.start()
    await node.until(
        lambda: node.kubelet.registrations[DP_RES] > before or WAITING in node.daemon.log(),
        OVERLAP_WAIT_S,
    )
    await asyncio.sleep(FIGHT_S)
    await first.terminate()  # the lingering one ends (a second one waiting may go on)
    return 1


async def case_two_dp_agents() -> list[Row]:
    return await dp_case("two agents (device plugin, MPS)", _second_dp_agent)


# -- issue 41: restarts into another config, crashes mid-step, rollbacks, MIG records ----------


def recording_smi(root: Path) -> Path:
    """An `nvidia-smi` that only records its arguments (`exclusive_left` reads them)."""
    script = root / "nvidia-smi"
    script.write_text(f'#!/bin/sh\necho "$*" >> {root / "nvidia-smi.calls"}\n', encoding="utf-8")
    script.chmod(0o755)
    return script


def exclusive_left(root: Path) -> set[str]:
    """GPUs whose last compute mode set through `recording_smi` is EXCLUSIVE_PROCESS."""
    modes: dict[str, str] = {}
    path = root / "nvidia-smi.calls"
    for line in path.read_text(encoding="utf-8").splitlines() if path.exists() else []:
        args = line.split()
        if "-i" in args and "-c" in args:
            modes[args[args.index("-i") + 1]] = args[args.index("-c") + 1]
    return {gpu for gpu, mode in modes.items() if mode == "EXCLUSIVE_PROCESS"}


TIME_SLICED = (
    f"version: v1\nsharing:\n  timeSlicing:\n    resources:\n"
    f"    - name: {DP_RES}\n      replicas: {DP_REPLICAS}\n"
)
RENAMED_RES = "nvidia.com/gpu.shared"
RENAMED = (
    f"version: v1\nsharing:\n  mps:\n    resources:\n    - name: {DP_RES}\n"
    f"      rename: {RENAMED_RES}\n      replicas: {DP_REPLICAS}\n"
)


async def dp_restarted_into(case: str, config: str, resource: str) -> list[Row]:
    """MPS with compute modes set and two pods admitted; the agent stopped (SIGTERM: it
    leaves the daemon to its clients) and started on `config`. Counted the moment the
    kubelet sees `resource`'s replicas: daemons of the old resource still running, and
    GPUs left in EXCLUSIVE_PROCESS that no daemon of the new config serves."""
    async with dp_node(compute_modes=True) as node:
        for i in range(2):
            await node.kubelet.admit("default", f"client-{i}", [("main", {DP_RES: 1})])
        pid = _read_pid(node.pipe)
        row = Row(case, 2)
        await node.daemon.terminate()
        (node.root / "config.yaml").write_text(config, encoding="utf-8")
        node.daemon = node.agent()
        await node.daemon.start()
        if not await node.until(lambda: node.kubelet.allocatable(resource) == DP_REPLICAS):
            row.fail(f"{resource} never advertised")
        stray = int(process_alive(pid))
        renamed = node.root / "mps" / resource / "pipe"
        serving = resource != DP_RES and await answers(renamed)
        modes = 0 if serving else len(exclusive_left(node.root))
        row.left = stray + modes
        if stray:
            row.notes.append("the old daemon still runs")
        if modes:
            row.notes.append("GPU left in EXCLUSIVE_PROCESS")
        if resource != DP_RES:
            if not serving:
                row.fail("the renamed resource's daemon does not answer")
            with contextlib.suppress(MpsError):  # no agent follows: the node's cleanup
                await ControlProgram(renamed, renamed.parent / "log", command=FAKE_MPS).send("quit")
        return [row]


async def case_dp_restart_without_mps() -> list[Row]:
    return await dp_restarted_into("restart into time-slicing (DP)", TIME_SLICED, DP_RES)


async def case_dp_restart_renamed_mps() -> list[Row]:
    return await dp_restarted_into("restart, MPS resource renamed (DP)", RENAMED, RENAMED_RES)


async def case_dra_crash_mid_prepare() -> list[Row]:
    """Claims in place under an agent that sets compute modes; a fourth, MPS, claim's
    daemon held at its start; the agent SIGKILLed once the GPU is EXCLUSIVE_PROCESS; the
    next agent must undo that claim (its daemon, the compute mode) and keep the others."""
    async with dra_node(node_spec=DRA_SPEC) as node:
        held = await place(node, IN_PLACE)
        smi = recording_smi(node.root)
        row = Row("crash mid-Prepare (DRA, MPS)", len(held))
        with Registrations(node.kubelet) as regs:
            await node.daemon.terminate()
            if not await start_agent(node, "agent-2.log", nvidia_smi=smi):
                row.fail("the agent did not come back")
            seen = regs.count
            mps = [{"opaque": {"driver": DRIVER, "parameters": MPS}}]
            ref = node.claim("crashed", "gpu-3", mps)
            gpu = node.gpu_uuid("gpu-3")
            key = claim_daemon_key(ref.uid, [gpu])
            (node.hold_dir / key).touch()
            pending = asyncio.create_task(node.kubelet.prepare(DRIVER, [ref]))
            pipe = node.plugin_dir / "mps" / key / "pipe"
            await node.until(
                lambda: _read_pid(pipe) != 0 and gpu in exclusive_left(node.root),
                "the held daemon and EXCLUSIVE_PROCESS",
            )
            assert node.daemon.proc is not None
            node.daemon.proc.kill()  # the crash
            await node.daemon.proc.wait()
            with contextlib.suppress(DraKubeletError):
                await pending
            cut = _read_pid(pipe)
            (node.hold_dir / key).unlink()  # it answers now, supervised by nobody
            if not await start_agent(node, "agent-3.log", nvidia_smi=smi):
                row.fail("the agent did not come back after the crash")
            await measure(node, held, row)
            row.left = int(gpu in exclusive_left(node.root)) + int(process_alive(cut))
            if row.left:
                row.notes.append("the cut claim's daemon or EXCLUSIVE_PROCESS left")
            await unprepare_all(node, held, row)
            row.extra_registrations = regs.count - seen - 1
        return [row]


PREVIOUS_RELEASE = "a7f2648"
"""The main-line commit before the DRA record could be incomplete: the release a rollback
meets whose reader knows nothing of that (tests/e2e_dra/test_dra_rollback.py)."""


def previous_release(into: Path) -> Path | None:
    """`PREVIOUS_RELEASE`'s `src` tree from git, or None (not a git checkout)."""
    repo = Path(__file__).resolve().parents[1]
    try:
        archive = subprocess.run(
            ["git", "-C", str(repo), "archive", PREVIOUS_RELEASE, "src"],
            capture_output=True,
            check=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")
    return into / "src"


async def case_rollback() -> list[Row]:
    """A corrupt record met with the API unreachable (the record written is incomplete),
    then `helm rollback`: the previous release's agent with the API back."""
    async with dra_node(node_spec=DRA_SPEC) as node:
        held = await place(node, IN_PLACE)
        row = Row(f"API-less start, rollback ({PREVIOUS_RELEASE})", len(held))
        code = previous_release(node.root / "previous")
        if code is None:
            row.fail(f"{PREVIOUS_RELEASE} is not in a git checkout here")
            return [row]
        with Registrations(node.kubelet) as regs:
            await node.daemon.terminate()
            path = node.plugin_dir / CHECKPOINT_NAME
            path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])  # truncated
            if not await start_agent(node, "agent-2.log", dead_kubeconfig(node)):
                row.fail("the agent did not load its record")
            await node.daemon.terminate()
            seen = regs.count
            if not await start_agent(node, "previous.log", code=code):
                row.fail("the previous release did not come up")
            await measure(node, held, row)
            # the previous release only asks the daemons it took over to quit
            await unprepare_all(node, held, row, exit_within_s=DIRS_S)
            row.extra_registrations = regs.count - seen - 1
        return [row]


class MigNode:
    """Dynamic MIG in-process (a simulated GPU lives in its process, so agent restarts are
    new drivers on the same files and the same backend, as `tests/agent/dynamic_mig` has them)."""

    CONFIG = "version: v1\nflags:\n  dynamicMig: {}\n"

    def __init__(self, root: Path) -> None:
        from gpuslice.backends import open_backend
        from gpuslice.backends.simulated import SimulatedBackend
        from gpuslice.emulator.dra_store import DraStore
        from gpuslice.whatif.claims import DEFAULT_DEVICE_CLASSES

        backend = open_backend("sim:1xh100-80gb/mig=")
        assert isinstance(backend, SimulatedBackend)
        self.backend = backend
        self.root = root
        self.store = DraStore("n1", DRIVER)
        for cls in DEFAULT_DEVICE_CLASSES:
            self.store.add_device_class(cls)
        self.fail_write = 0
        """The record write (1-based, from a driver's start) that fails as a kill would."""

    def snapshot(self) -> Any:
        from gpuslice.core.config import parse_config
        from gpuslice.core.sharing.plan import build_plan
        from gpuslice.state import PlanState

        inventory = self.backend.inventory()
        return PlanState(build_plan(inventory, parse_config(self.CONFIG)), inventory).current

    async def started(self) -> Any:
        """A driver as an agent's start builds one, loaded and its slices published."""
        from gpuslice.agent.dra_driver import DraDriver, DriverSettings
        from gpuslice.agent.dra_slices import SlicePublisher
        from gpuslice.agent.dynamic_mig import JOURNAL_NAME, DynamicMig
        from gpuslice.core.dra.cdispec import CDI_KIND
        from gpuslice.host.cdi_store import CdiSpecStore
        from gpuslice.host.checkpoint_file import CheckpointFile

        fail_at = self.fail_write

        class Record(CheckpointFile):
            writes = 0

            def write(self, data: bytes) -> None:
                Record.writes += 1
                if Record.writes == fail_at:
                    raise OSError("killed while writing")
                super().write(data)

        def dynamic() -> tuple[str, ...]:
            return tuple(self.snapshot().plan.dynamic_mig)

        mig = DynamicMig(self.backend, Record(self.root / JOURNAL_NAME), "boot")
        driver = DraDriver(
            DriverSettings(DRIVER, "n1", mps_root=str(self.root / "mps")),
            objects=self.store,
            checkpoint=CheckpointFile(self.root / CHECKPOINT_NAME),
            cdi=CdiSpecStore(self.root / "cdi", CDI_KIND),
            snapshot=self.snapshot,
            boot_id="boot",
            dynamic_mig=mig,
            dynamic=dynamic,
        )
        await driver.load()
        await SlicePublisher(
            self.store, driver=DRIVER, node="n1", snapshot=self.snapshot, dynamic=dynamic,
            ours=mig.ours,
        ).publish_once()  # fmt: skip
        return driver

    def claim(self, name: str, profile: str) -> ClaimRef:
        selector = f"device.attributes['{DRIVER}'].profile == '{profile}'"
        request = {"deviceClassName": "mig.nvidia.com",
                   "selectors": [{"cel": {"expression": selector}}]}  # fmt: skip
        made = self.store.add_claim({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": "ns"},
            "spec": {"devices": {"requests": [{"name": "mig", "exactly": request}]}},
        })  # fmt: skip
        self.store.allocate_claim("ns", name, pod_uid=f"pod-{name}", pod_name=name)
        return ClaimRef("ns", str(made["metadata"]["uid"]), name)

    def instances(self) -> int:
        return len(self.backend.inventory().gpus[0].mig_devices)


async def mig_record_case(case: str, damage: Callable[[MigNode], None]) -> Row:
    """A claim on a dynamic MIG partition prepared; `damage` done to the record (and to the
    next start); the agent started again; the claim unprepared: its instance must go."""
    from gpuslice.agent.dynamic_mig import JOURNAL_NAME

    root = Path(tempfile.mkdtemp(prefix="gsm-", dir="/tmp"))
    row = Row(case, 1)
    try:
        node = MigNode(root)
        first = await node.started()
        ref = node.claim("a", "3g.40gb")
        if (error := (await first.prepare([ref]))[ref.uid].error) != "":
            row.fail(f"Prepare failed: {error}")
            return row
        damage(node)
        if node.fail_write:
            with contextlib.suppress(OSError):  # the kill
                await node.started()
            node.fail_write = 0
            if not (root / JOURNAL_NAME).exists():
                row.notes.append("no record at the path after the kill")
        again = await node.started()
        row.lost_records = int(ref.uid not in again.claims)
        if errors := [e for e in (await again.unprepare([ref])).values() if e]:
            row.fail(f"Unprepare failed: {errors[0][:80]}")
        row.left = node.instances()
        if row.left:
            row.notes.append("the claim's MIG instance is never destroyed")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return row


def _record_removed(node: MigNode) -> None:
    from gpuslice.agent.dynamic_mig import JOURNAL_NAME

    (node.root / JOURNAL_NAME).unlink()


def _corrupt_then_killed(node: MigNode) -> None:
    from gpuslice.agent.dynamic_mig import JOURNAL_NAME

    (node.root / JOURNAL_NAME).write_bytes(b"\x00garbage")
    node.fail_write = 1  # the next start dies writing the rebuild


async def case_mig_record_lost() -> list[Row]:
    return [
        await mig_record_case("dynamic MIG record removed", _record_removed),
        await mig_record_case("  corrupt, killed mid-rebuild", _corrupt_then_killed),
    ]


# -- what already holds ----------------------------------------------------------------------


def _proc_figures(pid: int) -> tuple[int, int, int]:
    """(open descriptors, threads, RSS KiB) of `pid`."""
    fds = len(os.listdir(f"/proc/{pid}/fd"))
    status = dict(
        line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
    )
    return fds, int(status["Threads"]), int(status["VmRSS"].split()[0])


async def hold_soak(cycles: int, holds: Holds) -> None:
    async with dra_node(node_spec=DRA_SPEC) as node:
        assert node.daemon.proc is not None
        pid = node.daemon.proc.pid
        ref = node.claim("soak", "gpu-0")
        for _ in range(50):  # warm-up: lazy imports, first connections, caches
            await timed_cycle(node, ref)
        start = _proc_figures(pid)
        t0 = time.perf_counter()
        for _ in range(cycles):
            await timed_cycle(node, ref)
        holds.cycle_s = (time.perf_counter() - t0) / cycles
        end = _proc_figures(pid)
        holds.cycles = cycles
        holds.fds, holds.threads, holds.rss_kib = (
            (start[0], end[0]),
            (start[1], end[1]),
            (start[2], end[2]),
        )


async def hold_kubelet_restart(holds: Holds) -> None:
    """An MPS claim's Prepare waits on its daemon (held at its start) when the kubelet
    restarts: its connection goes, the call is cancelled, the Prepare must be undone."""
    async with dra_node(node_spec=DRA_SPEC) as node:
        mps = [{"opaque": {"driver": DRIVER, "parameters": MPS}}]
        ref = node.claim("cut", "gpu-0", mps)
        daemon_dir = node.plugin_dir / "mps" / claim_daemon_key(ref.uid, [node.gpu_uuid("gpu-0")])
        pid_file = daemon_dir / "pipe" / PID_FILE
        hold = node.hold_dir / daemon_dir.name
        hold.touch()
        call = asyncio.ensure_future(node.kubelet.prepare(DRIVER, [ref]))
        await node.until(lambda: pid_file.exists() or call.done(), "the held daemon started")
        pid = _read_pid(pid_file.parent)
        await node.kubelet.restart()
        await asyncio.wait([call])
        if call.cancelled():  # the emulator closing its channel cancels the call client-side
            outcome = "cancelled"
        elif (exc := call.exception()) is not None:
            outcome = f"{type(exc).__name__}: {str(exc)[:80]}"
        else:
            outcome = f"answered: {call.result()[ref.uid].error[:80] or 'prepared'}"

        def left() -> tuple[int, int, int, int]:
            return (
                int(pid != 0 and process_alive(pid)),
                int(daemon_dir.exists()),
                len([p for p in node.cdi_specs() if ref.uid in p.name]),
                int(ref.uid in recorded(node)),
            )

        t0 = time.perf_counter()
        with contextlib.suppress(SystemExit):
            await node.until(lambda: left() == (0, 0, 0, 0), "the cut Prepare undone")
        holds.restart_undo_s = time.perf_counter() - t0
        holds.restart_left, holds.restart_outcome = left(), outcome
        hold.unlink(missing_ok=True)
        await node.kubelet.wait_registered(DRIVER, WAIT_S)
        retry = (await node.kubelet.prepare(DRIVER, [ref]))[ref.uid]
        holds.retry = "succeeded" if not retry.error else f"failed: {retry.error[:80]}"
        await node.kubelet.unprepare(DRIVER, [ref])


# -- the run ---------------------------------------------------------------------------------

CASES: list[Callable[[], Awaitable[list[Row]]]] = [
    case_upgrade,
    case_removed,
    case_api_less,
    case_two_dra_agents,
    case_reboot,
    case_dra_sigkill,
    case_two_dp_agents,
    case_dp_sigkill,
    case_dp_sigterm,
    case_dp_restart_without_mps,
    case_dp_restart_renamed_mps,
    case_dra_crash_mid_prepare,
    case_rollback,
    case_mig_record_lost,
]


def _cell(value: int | None) -> str:
    return "-" if value is None else str(value)


def print_table(rows: list[Row]) -> None:
    print("\nlifecycle: what each event lost (goal: 0 in every column; '-': does not apply)")
    head = ("case", "claims/pods", "lost CDI", "lost records", "daemons replaced",
            "MPS dirs left", "extra regs", "left behind")  # fmt: skip
    print(f"{head[0]:<36}" + "".join(f"{h:>{len(h) + 2}}" for h in head[1:]) + "  notes")
    for r in rows:
        cells = (r.claims, r.lost_specs, r.lost_records, r.replaced, r.dirs_left,
                 r.extra_registrations, r.left)  # fmt: skip
        line = f"{r.case:<36}" + "".join(
            f"{_cell(c):>{len(h) + 2}}" for c, h in zip(cells, head[1:], strict=True)
        )
        print(line + ("  " + "; ".join(r.notes) if r.notes else ""))


def print_holds(h: Holds) -> None:
    """What already holds, for the parts that ran."""
    print("\nlifecycle: what already holds")
    if h.cycles:
        print(
            f"  {h.cycles} Prepare/Unprepare cycles ({h.cycle_s * 1e3:.1f} ms each): descriptors "
            f"{h.fds[0]} -> {h.fds[1]}, threads {h.threads[0]} -> {h.threads[1]}, RSS "
            f"{h.rss_kib[0] / 1024:.1f} -> {h.rss_kib[1] / 1024:.1f} MiB ({h.rss_x:.2f}x): "
            f"{'flat' if h.flat else 'NOT FLAT'}"
        )
    if h.restart_outcome:
        daemons, dirs, specs, records = h.restart_left
        print(
            f"  kubelet restart during an MPS Prepare: the call ended {h.restart_outcome}; "
            f"left {daemons} MPS daemons, {dirs} MPS directories, {specs} CDI specs, "
            f"{records} records (undone {h.restart_undo_s:.1f} s after the restart); "
            f"retry {h.retry}"
        )


async def scenario_lifecycle(quick: bool, only: str = "") -> tuple[str, bool]:
    """Runs every case (those whose function name holds `only`, when given), prints the
    tables; returns (one-line summary, nothing lost and what held still holds)."""
    rows: list[Row] = []
    for case in CASES:
        if only in case.__name__:
            t0 = time.perf_counter()
            rows += await case()
            print(f"{case.__name__}: {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    holds = Holds()
    if only in "hold_soak":
        t0 = time.perf_counter()
        await hold_soak(300 if quick else 3000, holds)
        print(f"hold_soak: {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    if only in "hold_kubelet_restart":
        t0 = time.perf_counter()
        await hold_kubelet_restart(holds)
        print(f"hold_kubelet_restart: {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    else:
        holds.retry = "succeeded"  # not run: neither reported nor held against the run
    if rows:
        print_table(rows)
    if holds.cycles or holds.restart_outcome:
        print_holds(holds)
    losing = [r for r in rows if not r.clean]
    parts = [
        f"lifecycle: {len(rows) - len(losing)} of {len(rows)} cases lost nothing"
        + (f" (losing: {', '.join(r.case.strip() for r in losing)})" if losing else "")
    ]
    if holds.cycles:
        parts.append(
            f"{holds.cycles} Prepare/Unprepare cycles ended at {holds.rss_x:.2f}x their RSS, "
            f"{'flat' if holds.flat else 'NOT flat'}"
        )
    if holds.restart_outcome:
        parts.append(
            "a kubelet restart mid-Prepare "
            + ("undone cleanly" if holds.undone else "NOT undone cleanly")
        )
    summary = "; ".join(parts)
    print(summary)
    return summary, not losing and holds.flat and holds.undone


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="300 soak cycles instead of 3,000")
    parser.add_argument(
        "--require-nothing-lost",
        action="store_true",
        help="exit 1 when a case lost anything or what held no longer does",
    )
    parser.add_argument(
        "--case", default="", help="only the cases whose function name holds this (see --list)"
    )
    parser.add_argument("--list", action="store_true", help="print the case names and stop")
    args = parser.parse_args()
    if args.list:
        print("\n".join([c.__name__ for c in CASES] + ["hold_soak", "hold_kubelet_restart"]))
        return
    summary, clean = asyncio.run(scenario_lifecycle(args.quick, args.case))
    print(f"Closing note: {summary}.")
    if args.require_nothing_lost and not clean:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
