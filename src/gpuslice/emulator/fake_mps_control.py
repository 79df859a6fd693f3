"""A stand-in for `nvidia-cuda-mps-control`, so the MPS daemon manager runs without a GPU.

It behaves like the real program where the manager depends on it: `-d` leaves a daemon
running in the background with `nvidia-cuda-mps-control.pid` in `CUDA_MPS_PIPE_DIRECTORY`
and `control.log` in `CUDA_MPS_LOG_DIRECTORY`; without `-d` it sends the commands read from
stdin to that daemon and prints the answers, failing when no daemon answers. Tests crash
the daemon with SIGKILL (pid from the pid file) or freeze it with SIGSTOP.

A slow start (a real daemon on a busy GPU can take seconds before it answers) is played
with `GPUSLICE_FAKE_MPS_HOLD_DIR`: while that directory holds a file named after the
daemon's directory (the parent of its pipe directory: a claim daemon's key), the daemon
has started (its pid file is written, so `-d` returns as the real one's does) but opens no
control socket. Removing the file lets it go on; so does removing its pipe directory.

With `GPUSLICE_FAKE_MPS_SERVER=<pid>` in its environment the daemon lists that PID as its
running server and takes `terminate_client` for it (the memory guard's stop of an MPS
client).

`-d -M` starts a multi-user daemon, as the real program's `-M` does (NVIDIA's DRA driver
starts it so for `mpsConfig.multiUser`). What the daemon was started with, which the real
one keeps to itself, is written to `control.log` on its start, for tests to read:
`Control <pid> Started multi-user=<yes|no> CUDA_VISIBLE_DEVICES=<value or unset>`.

Run it as `python -m gpuslice.emulator.fake_mps_control [-d [-M]]`. It ships in the package (not
in `gpuslice.testing`) because `gpuslice demo --dra` runs claims with MPS on it.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from gpuslice.core.mps import pinned_limit_shown

PID_FILE = "nvidia-cuda-mps-control.pid"
SOCKET_NAME = "control"
DEFAULT_PIPE_DIR = "/tmp/nvidia-mps"
DEFAULT_LOG_DIR = "/var/log/nvidia-mps"
_LIMIT = re.compile(r"^[0-9]+[MG]$")
NO_DAEMON = "Cannot find MPS control daemon process"


@dataclass(slots=True)
class DaemonState:
    """What the real daemon remembers between commands (and forgets on quit).

    Its answers are the real program's, as read on an H200 with driver 580.159.04 (the
    closing note of issue 32 quotes them): a command the daemon rejects still exits 0, an
    out-of-range thread percentage leaves the old one and prints it, a malformed or
    unknown-device pinned limit is ignored without a word, an unknown command prints
    `Unknown command "<line>"`, and a pinned limit reads back in whole GiB, rounded down,
    from 1024 MiB on (`gpuslice.core.mps.pinned_limit_shown`). The manager therefore checks
    its settings by reading them back, not by the exit status.
    """

    active_thread_percentage: str = "100.0"
    pinned_limits_mib: dict[str, int] = field(default_factory=dict)
    quitting: bool = False

    def execute(self, line: str) -> str:
        words = line.split()
        if not words:
            return ""
        name, args = words[0], words[1:]
        if name == "set_default_active_thread_percentage" and len(args) == 1:
            try:
                pct = float(args[0])
            except ValueError:
                pct = -1.0
            if 0 < pct <= 100:
                self.active_thread_percentage = f"{pct:.1f}"
            return self.active_thread_percentage
        if name == "get_default_active_thread_percentage" and not args:
            return self.active_thread_percentage
        if name == "set_default_device_pinned_mem_limit" and len(args) == 2:
            if _LIMIT.match(args[1]):
                value = int(args[1][:-1])
                self.pinned_limits_mib[args[0]] = value * 1024 if args[1][-1] == "G" else value
            return ""
        if name == "get_default_device_pinned_mem_limit" and len(args) == 1:
            return pinned_limit_shown(self.pinned_limits_mib.get(args[0], 0))
        if name == "get_server_list" and not args:
            # no client ever starts a server here; a test may name one (SERVER_ENV)
            return os.environ.get(SERVER_ENV, "")
        if name == "terminate_client" and len(args) == 2 and os.environ.get(SERVER_ENV):
            return ""  # taken (the command is in control.log, for tests to read)
        if name == "ps" and not args:
            return "Server not found"
        if name == "quit" and not args:
            self.quitting = True
            return ""
        return f'Unknown command "{line.strip()}"'


def _dirs() -> tuple[Path, Path]:
    pipe = Path(os.environ.get("CUDA_MPS_PIPE_DIRECTORY") or DEFAULT_PIPE_DIR)
    log = Path(os.environ.get("CUDA_MPS_LOG_DIRECTORY") or DEFAULT_LOG_DIR)
    return pipe, log


def process_alive(pid: int) -> bool:
    """True for a running (or stopped) process; a zombie counts as dead."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    state = stat.rsplit(")", 1)[-1].split()[0]
    return state not in ("Z", "X")


HOLD_ENV = "GPUSLICE_FAKE_MPS_HOLD_DIR"
SERVER_ENV = "GPUSLICE_FAKE_MPS_SERVER"
"""A PID the daemon lists as its running MPS server (`get_server_list`), taking
`terminate_client` for it; unset, the daemon has no server, as nothing here starts one."""


def _held(pipe: Path) -> bool:
    """Whether this daemon is held at its start (see the module docstring)."""
    hold_dir = os.environ.get(HOLD_ENV, "")
    return bool(hold_dir) and (Path(hold_dir) / pipe.parent.name).exists()


def _write_pid(pipe: Path) -> None:
    """The pid file, whole or not at all (renamed into place): `-d` returns once it exists,
    and a reader must never take a file caught mid-write for one that holds no pid."""
    partial = pipe / f".{PID_FILE}.{os.getpid()}"
    partial.write_text(f"{os.getpid()}\n")
    os.replace(partial, pipe / PID_FILE)


def _serve(pipe: Path, log: Path, *, multi_user: bool = False) -> int:
    """The daemon: answer one command per connection until `quit`."""
    sock_path = pipe / SOCKET_NAME
    sock_path.unlink(missing_ok=True)
    state = DaemonState()
    with (
        socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as server,
        (log / "control.log").open("a", buffering=1) as logf,
    ):
        if _held(pipe):
            _write_pid(pipe)  # started, not answering
            while _held(pipe) and pipe.is_dir():
                time.sleep(0.05)
            if not pipe.is_dir():
                return 0
        server.bind(str(sock_path))
        server.listen(16)
        _write_pid(pipe)
        visible = os.environ.get("CUDA_VISIBLE_DEVICES", "unset")
        logf.write(
            f"[{time.strftime('%F %T')}] Control {os.getpid()} Started "
            f"multi-user={'yes' if multi_user else 'no'} CUDA_VISIBLE_DEVICES={visible}\n"
        )
        server.settimeout(1.0)
        while not state.quitting:
            try:
                conn, _ = server.accept()
            except TimeoutError:
                # Its pipe directory is gone (a test's or the demo's temp dir removed, with
                # the daemon left running for a next agent that never came): nobody can
                # reach it any more, so it ends instead of lingering. A removed socket alone
                # does not end it, as it does not end the real daemon: its clients go on.
                if not pipe.is_dir():
                    break
                continue
            with conn:
                conn.settimeout(5.0)
                try:
                    request = _read_all(conn).decode(errors="replace").strip()
                except OSError:
                    continue  # a client that never finished its command
                logf.write(f"[{time.strftime('%F %T')}] Control {os.getpid()} Command: {request}\n")
                reply = "ok\n" + state.execute(request)
                with contextlib.suppress(OSError):
                    conn.sendall(reply.encode())
        logf.write(f"[{time.strftime('%F %T')}] Control {os.getpid()} Exit\n")
    sock_path.unlink(missing_ok=True)
    (pipe / PID_FILE).unlink(missing_ok=True)
    return 0


def _read_all(conn: socket.socket) -> bytes:
    chunks: list[bytes] = []
    while chunk := conn.recv(4096):
        chunks.append(chunk)
    return b"".join(chunks)


def _ask(pipe: Path, command: str) -> tuple[bool, str]:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.connect(str(pipe / SOCKET_NAME))
        conn.sendall(command.encode())
        conn.shutdown(socket.SHUT_WR)
        status, _, text = _read_all(conn).decode(errors="replace").partition("\n")
    return status == "ok", text


def _answers(pipe: Path) -> bool:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        try:
            conn.connect(str(pipe / SOCKET_NAME))
        except OSError:
            return False
    return True


def _daemonize(pipe: Path, log: Path, *, multi_user: bool = False) -> int:
    """`-d`: start the server in its own session and return once it accepts commands."""
    pid_file = pipe / PID_FILE
    # Like the real program, "running" means a daemon answers on the pipe directory; the
    # pid file is only written for people, and anyone with the directory can write it.
    if _answers(pipe):
        print("An instance of this daemon is already running")  # stdout, as the real one
        return 1
    pid_file.unlink(missing_ok=True)
    if not pipe.is_dir() or not log.is_dir():
        print(f"pipe or log directory missing: {pipe}, {log}", file=sys.stderr)
        return 1
    devnull = [(os.POSIX_SPAWN_OPEN, fd, os.devnull, os.O_RDWR, 0) for fd in (0, 1, 2)]
    child = os.posix_spawn(
        sys.executable,
        [
            sys.executable,
            "-m",
            "gpuslice.emulator.fake_mps_control",
            "--serve",
            *(["-M"] if multi_user else []),
        ],
        os.environ,
        file_actions=devnull,
        setsid=True,
    )
    deadline = time.monotonic() + 10.0
    while time.monotonic() < deadline:
        done, status = os.waitpid(child, os.WNOHANG)
        if done:
            code = os.waitstatus_to_exitcode(status)
            print(f"daemon exited at start with status {code}", file=sys.stderr)
            return 1
        if pid_file.exists():
            return 0  # the daemon is reparented when this process exits
        time.sleep(0.01)
    os.kill(child, signal.SIGKILL)
    os.waitpid(child, 0)
    print("daemon did not start within 10 s", file=sys.stderr)
    return 1


def _client(pipe: Path) -> int:
    status = 0
    for line in sys.stdin:
        command = line.strip()
        if not command:
            continue
        try:
            ok, text = _ask(pipe, command)
        except OSError as exc:
            del exc  # the real program names no cause
            print(NO_DAEMON, file=sys.stderr)
            return 1
        if ok:
            if text:
                print(text)
        else:
            print(text, file=sys.stderr)
            status = 1
    return status


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    pipe, log = _dirs()
    if args in (["-d"], ["-d", "-M"]):
        return _daemonize(pipe, log, multi_user="-M" in args)
    if args in (["--serve"], ["--serve", "-M"]):
        return _serve(pipe, log, multi_user="-M" in args)
    if not args:
        return _client(pipe)
    print(f"unsupported arguments: {' '.join(args)} (this fake knows -d, -d -M)", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
