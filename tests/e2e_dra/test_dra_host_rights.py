"""DRA mode without the rights it needs on a host directory (the image's own uid against
root-owned kubelet directories, a read-only mount, a wrong path): one `error:` line naming
the directory and the errno, exit 2, no traceback, as for any other bad input."""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest

from gpuslice.testing.apiserver import FakeApiServer

NODE = "n1"


def _run_dra(
    api: FakeApiServer,
    workdir: Path,
    dirs: dict[str, Path],
    *,
    user: int | None = None,
    wrapper: Sequence[str] = (),
) -> subprocess.CompletedProcess[str]:
    api.add_node(NODE)
    kubeconfig = api.write_kubeconfig(workdir / "kubeconfig")
    kubeconfig.chmod(0o644)
    return subprocess.run(
        [
            *wrapper,
            sys.executable, "-m", "gpuslice", "plugin",
            "--node", "sim:1xt4",
            "--node-name", NODE,
            "--kubeconfig", str(kubeconfig),
            "--dra",
            "--dra-plugin-dir", str(dirs["plugin"]),
            "--dra-registry-dir", str(dirs["registry"]),
            "--cdi-root", str(dirs["cdi"]),
            "--no-labels",
            "--no-compute-mode",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        user=user,
        env={**os.environ, "HOME": str(workdir)},
    )  # fmt: skip


def _dirs(workdir: Path) -> dict[str, Path]:
    dirs = {"plugin": workdir / "plug", "registry": workdir / "reg", "cdi": workdir / "cdi"}
    for path in dirs.values():
        path.mkdir()
    return dirs


@pytest.mark.parametrize(
    ("which", "named"),
    [
        ("plugin", "DRA plugin directory"),
        ("registry", "kubelet plugin registry directory"),
        ("cdi", "CDI spec directory"),
    ],
)
def test_a_directory_it_cannot_make_is_one_line_naming_it(
    sock_dir: Path, api: FakeApiServer, which: str, named: str
) -> None:
    """A path through a regular file fails for root too (ENOTDIR), where permission bits
    would not stop it."""
    dirs = _dirs(sock_dir)
    blocker = sock_dir / "a-file"
    blocker.write_text("not a directory\n", encoding="utf-8")
    dirs[which] = blocker / which
    result = _run_dra(api, sock_dir, dirs)
    assert "Traceback" not in result.stderr, result.stderr
    assert result.returncode == 2, result.stderr
    errors = [ln for ln in result.stderr.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1, result.stderr
    assert named in errors[0], errors
    assert str(dirs[which]) in errors[0], errors
    assert "ENOTDIR" in errors[0], errors
    assert "event=plan " not in result.stderr  # nothing was started


def test_the_images_uid_against_root_owned_directories_is_eacces(
    sock_dir: Path, api: FakeApiServer
) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to run the agent as another uid")
    nobody = pwd.getpwnam("nobody").pw_uid
    try:
        probe = subprocess.run(
            [sys.executable, "-c", "import gpuslice"], user=nobody, capture_output=True, check=False
        )
    except OSError:  # the interpreter itself is out of its reach (a venv under /root)
        probe = None
    if probe is None or probe.returncode != 0:
        pytest.skip(f"uid {nobody} cannot run {sys.executable} with gpuslice importable")
    sock_dir.chmod(0o755)
    dirs = _dirs(sock_dir)  # root's, 0755
    result = _run_dra(api, sock_dir, dirs, user=nobody)
    assert "Traceback" not in result.stderr, result.stderr
    assert result.returncode == 2, result.stderr
    errors = [ln for ln in result.stderr.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1, result.stderr
    assert str(dirs["plugin"]) in errors[0], errors
    assert "EACCES" in errors[0], errors


READ_ONLY = 'mount --bind "$1" "$1" && mount -o remount,bind,ro "$1" && shift && exec "$@"'


def test_a_read_only_plugin_directory_is_erofs(sock_dir: Path, api: FakeApiServer) -> None:
    """Root against a read-only mount: the kernel refuses the write, as it refuses the
    image's uid on a root-owned directory (the next test, where it can run)."""
    unshare = shutil.which("unshare")
    if os.geteuid() != 0 or unshare is None:
        pytest.skip("needs root and unshare(1) for a private read-only bind mount")
    dirs = _dirs(sock_dir)
    wrapper = [unshare, "--mount", "--propagation", "private", "sh", "-c", READ_ONLY, "sh"]
    probe = subprocess.run(
        [*wrapper, str(dirs["plugin"]), "true"], capture_output=True, check=False
    )
    if probe.returncode != 0:
        pytest.skip(f"no private mount here: {probe.stderr.decode(errors='replace').strip()}")
    result = _run_dra(api, sock_dir, dirs, wrapper=[*wrapper, str(dirs["plugin"])])
    assert "Traceback" not in result.stderr, result.stderr
    assert result.returncode == 2, result.stderr
    errors = [ln for ln in result.stderr.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1, result.stderr
    assert str(dirs["plugin"]) in errors[0], errors
    assert "EROFS" in errors[0], errors
