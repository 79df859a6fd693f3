"""A real `gpuslice plugin` process on a simulated node, driven by the kubelet emulator."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from gpuslice.backends.simulated.control import ControlDir
from gpuslice.emulator.kubelet import KubeletEmulator
from gpuslice.testing.daemon import DaemonProcess

STARTUP_S = 30.0
"""Deadline for the daemon process to start and register (a loaded 2-core CI machine)."""

FAKE_MPS = f"{sys.executable} -m gpuslice.emulator.fake_mps_control"


@dataclass(slots=True)
class Node:
    kubelet: KubeletEmulator
    daemon: DaemonProcess
    control: ControlDir
    config: Path
    plugin_dir: Path
    workdir: Path

    def write_config(self, text: str) -> None:
        tmp = self.config.with_suffix(".tmp")
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, self.config)

    def plugin_sockets(self) -> set[str]:
        """Our sockets: the kubelet's own and the node lock (a regular file) are not."""
        return {
            p.name for p in self.plugin_dir.iterdir() if p.name != "kubelet.sock" and p.is_socket()
        }


@contextlib.asynccontextmanager
async def running_daemon(
    workdir: Path,
    config: str | dict[str, str],
    *,
    node: str = "sim:2xt4",
    args: Sequence[str] = (),
    env: dict[str, str] | None = None,
    expect: str = "nvidia.com/gpu",
) -> AsyncIterator[Node]:
    plugin_dir = workdir / "dp"
    plugin_dir.mkdir()
    control_dir = workdir / "ctl"
    if isinstance(config, dict):
        # a ConfigMap volume: one file per named config
        config_path = workdir / "configs"
        config_path.mkdir()
        for name, text in config.items():
            (config_path / name).write_text(text, encoding="utf-8")
    else:
        config_path = workdir / "config.yaml"
        config_path.write_text(config, encoding="utf-8")
    kubelet = KubeletEmulator(plugin_dir)
    await kubelet.start()
    daemon = DaemonProcess(
        [
            "--node",
            node,
            "--config-file",
            str(config_path),
            "--device-plugin-path",
            str(plugin_dir),
            "--no-compute-mode",
            "--mps-control",
            FAKE_MPS,
            *(args or ["--no-labels"]),
        ],
        log_path=workdir / "daemon.log",
        env={"GPUSLICE_SIM_CONTROL_DIR": str(control_dir), **(env or {})},
    )
    await daemon.start()
    state = Node(kubelet, daemon, ControlDir(control_dir), config_path, plugin_dir, workdir)
    try:
        try:
            if expect:
                await kubelet.wait_for(
                    lambda: kubelet.capacity(expect) > 0 or not daemon.running, STARTUP_S
                )
            else:  # nothing to advertise yet: wait for the first plan instead
                await kubelet.wait_for(
                    lambda: "event=plan " in daemon.log() or not daemon.running, STARTUP_S
                )
        except TimeoutError:
            raise AssertionError(f"daemon never registered {expect}:\n{daemon.log()}") from None
        assert daemon.running, f"daemon exited:\n{daemon.log()}"
        yield state
    finally:
        code = await daemon.terminate()
        await kubelet.stop()
    assert code == 0, f"daemon exit code {code}:\n{daemon.log()}"
