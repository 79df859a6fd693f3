"""The Dockerfile the chart deploys, built and run (issue: it had never been built by anything
the project runs).

scripts/build-image builds it with buildah on a Debian bookworm base made by mmdebstrap
(python3 3.11, standing in for python:3.11-slim); runc runs it from the image's own config,
as the image's user, with a read-only root and no capabilities as the chart's pod has. The
demo runs in it, and the daemon in it registers with a kubelet emulator running here on the
host through a socket directory shared with the container, as the kubelet's
device-plugins directory is on a node.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from pathlib import Path

import pytest

from gpuslice.emulator.kubelet import KubeletEmulator
from gpuslice.host.nodelock import LOCK_NAME
from gpuslice.testing.image import Bind, Buildah, Container, ImageConfig, Runc, write_bundle

# The build (scripts/build-image) runs in the first test's setup: a minute or two on a
# 2-core CI machine with the base cached, more when mmdebstrap has to make the base.
pytestmark = pytest.mark.timeout(900)

USER = (65532, 65532)
STARTUP_S = 60.0
"""Deadline for the daemon in the container to register (a loaded 2-core CI machine)."""

ADDED_LIMIT = 150 * 2**20
"""What the Dockerfile may add to its base. It adds the virtualenv (about 90 MiB: grpcio,
pydantic-core, re2, lightkube's models); build tools, the wheel cache or dev dependencies
reaching the runtime stage would go past it."""

TS4 = """\
version: v1
sharing:
  timeSlicing:
    resources:
    - name: nvidia.com/gpu
      replicas: 4
"""


def test_the_image_runs_gpuslice_plugin_as_a_numeric_non_root_user(
    image_config: ImageConfig,
) -> None:
    assert image_config.user == "65532:65532"
    assert image_config.numeric_user() == USER
    assert image_config.entrypoint == ("gpuslice",)
    assert image_config.cmd == ("plugin",)
    assert any(e.startswith("PATH=/opt/gpuslice/bin:") for e in image_config.env)


def test_what_the_dockerfile_adds_to_its_base_stays_small(
    buildah: Buildah, image_config: ImageConfig, report_line: Callable[[str], None]
) -> None:
    assert image_config.base_name, "the image does not name its base"
    base = buildah.inspect(image_config.base_name)
    assert image_config.layer_sizes[: len(base.layer_sizes)] == base.layer_sizes
    added = image_config.size - base.size
    mib = 2**20
    report_line(
        f"image size {image_config.size / mib:.0f} MiB uncompressed: base "
        f"{base.size / mib:.0f} MiB ({image_config.base_name}) + {added / mib:.0f} MiB",
    )
    assert 0 < added < ADDED_LIMIT, f"the Dockerfile adds {added / mib:.0f} MiB to its base"


def test_no_test_doubles_build_leftovers_or_build_secret_in_the_image(
    rootfs: Path, image_config: ImageConfig
) -> None:
    [site] = (rootfs / "opt/gpuslice/lib").glob("python3*/site-packages")
    assert (site / "gpuslice/cli/main.py").is_file(), "gpuslice is not installed in the venv"
    assert (site / "gpuslice/emulator/kubelet.py").is_file(), "the demo needs the emulator"
    assert not (site / "gpuslice/testing").exists(), "the test doubles are in the image"
    for leftover in ("src", "wheels", "run/secrets/ca-bundle"):
        assert not (rootfs / leftover).exists(), f"/{leftover} is in the image"
    for name in ("PIP_CERT", "SSL_CERT_FILE", "REQUESTS_CA_BUNDLE"):
        assert not any(e.startswith(f"{name}=") for e in image_config.env), name


def test_gpuslice_demo_runs_in_the_image(
    rootfs: Path, image_config: ImageConfig, runc: Runc, tmp_path: Path
) -> None:
    bundle = tmp_path / "bundle"
    write_bundle(bundle, rootfs, image_config, ["demo"])
    done = runc.run(bundle, timeout_s=120)
    assert done.returncode == 0, f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    assert "it advertises 8 devices and 4 of 4 pods run" in done.stdout


async def test_the_daemon_in_the_image_registers_with_a_kubelet_outside_it(
    rootfs: Path, image_config: ImageConfig, runc: Runc, sock_dir: Path, tmp_path: Path
) -> None:
    # The device-plugins directory is shared with the container, as the chart mounts the
    # node's. The image's user must be able to create its socket there and dial the
    # kubelet's: on a node the chart runs the agent as root for this; here the directory
    # and the emulator's socket are opened to the image's user instead, so the test also
    # shows that user running the daemon.
    plugin_dir = sock_dir / "dp"
    plugin_dir.mkdir()
    os.chown(plugin_dir, *USER)
    configs = tmp_path / "configs"
    configs.mkdir()
    (configs / "config.yaml").write_text(TS4, encoding="utf-8")

    bundle = tmp_path / "bundle"
    write_bundle(
        bundle,
        rootfs,
        image_config,
        [
            "plugin",
            "--node",
            "sim:2xt4",
            "--config-file",
            "/config/config.yaml",
            "--device-plugin-path",
            "/var/lib/kubelet/device-plugins",
            "--no-labels",
            "--no-compute-mode",
        ],
        binds=[
            Bind(plugin_dir, "/var/lib/kubelet/device-plugins"),
            Bind(configs, "/config", readonly=True),
        ],
    )
    kubelet = KubeletEmulator(plugin_dir)
    await kubelet.start()
    container = Container(runc, bundle, tmp_path / "container.log")
    code: int | None = None
    try:
        kubelet.socket_path.chmod(0o666)
        await container.start()
        try:
            await kubelet.wait_for(
                lambda: kubelet.capacity("nvidia.com/gpu") == 8 or not container.running,
                STARTUP_S,
            )
        except TimeoutError:
            raise AssertionError(f"no registration:\n{container.log()}") from None
        assert container.running, f"the container exited:\n{container.log()}"
        assert kubelet.allocatable("nvidia.com/gpu") == 8
        assert container.process_ids() == USER
        [plugin_socket] = [
            p for p in plugin_dir.iterdir() if p.name not in ("kubelet.sock", LOCK_NAME)
        ]
        st = plugin_socket.lstat()
        assert stat.S_ISSOCK(st.st_mode)
        assert (st.st_uid, st.st_gid) == USER, "the plugin's socket is not the image user's"
        code = await container.terminate()
    finally:
        if code is None:
            await container.terminate()
        await kubelet.stop()
    assert code == 0, f"the daemon did not stop cleanly on SIGTERM:\n{container.log()}"
    assert not plugin_socket.exists(), "the daemon left its socket behind"
