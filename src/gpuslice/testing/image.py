"""The node agent image, built by scripts/build-image and run the way a container runtime runs it.

There is no Docker engine or registry where the tests run, so the image is built with
buildah (vfs storage, chroot isolation) and run with runc from an OCI bundle made from the
image's own config: its entrypoint and command, its user, its environment and working
directory. Like the chart's pod, the root filesystem is read-only, /tmp is a small tmpfs and
the process has no capabilities; so a run here fails where the image would fail on a node
for those reasons, not only where Python fails.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from gpuslice.core.jsontypes import Json

ROOT = Path(__file__).resolve().parents[3]
BUILD_SCRIPT = ROOT / "scripts" / "build-image"
BASE_UNAVAILABLE = 75
"""scripts/build-image's exit status when the base cannot be made here (no mirror, ...)."""


def default_cache() -> Path:
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg) / "gpuslice" / "image"


@dataclass(frozen=True, slots=True)
class ImageConfig:
    """The parts of an OCI image config a runtime acts on, plus its history and layers."""

    user: str
    entrypoint: tuple[str, ...]
    cmd: tuple[str, ...]
    env: tuple[str, ...]
    workdir: str
    layer_sizes: tuple[int, ...]
    base_name: str
    history: tuple[str, ...]

    @property
    def size(self) -> int:
        """Uncompressed size: the sum of the layers, as the node's disk holds them."""
        return sum(self.layer_sizes)

    def numeric_user(self) -> tuple[int, int]:
        """uid and gid. A name would not do: the kubelet cannot check runAsNonRoot on it."""
        uid, _, gid = self.user.partition(":")
        if not uid.isdigit() or not gid.isdigit():
            raise ValueError(f"image user {self.user!r} is not numeric uid:gid")
        return int(uid), int(gid)


@dataclass(frozen=True, slots=True)
class Buildah:
    """buildah on a storage root of its own, so tests neither see nor disturb the host's."""

    root: Path

    def argv(self, *args: str) -> list[str]:
        return [
            "buildah",
            "--root",
            str(self.root),
            "--runroot",
            str(self.root / "run"),
            "--storage-driver",
            "vfs",
            *args,
        ]

    def __call__(self, *args: str, timeout_s: float = 120.0) -> str:
        proc = subprocess.run(
            self.argv(*args), capture_output=True, text=True, check=False, timeout=timeout_s
        )
        if proc.returncode != 0:
            raise RuntimeError(f"buildah {' '.join(args)} failed: {proc.stderr.strip()}")
        return proc.stdout

    def build(self, tag: str, *, timeout_s: float = 900.0) -> subprocess.CompletedProcess[str]:
        """scripts/build-image into this storage root; the caller reads the exit status."""
        env = {**os.environ, "GPUSLICE_BUILDAH_ROOT": str(self.root)}
        return subprocess.run(
            [str(BUILD_SCRIPT), tag],
            capture_output=True,
            text=True,
            check=False,
            timeout=timeout_s,
            env=env,
            cwd=ROOT,
            stdin=subprocess.DEVNULL,
        )

    def inspect(self, image: str) -> ImageConfig:
        data: Json = json.loads(self("inspect", "--type", "image", image))
        config: Json = data["OCIv1"].get("config") or {}
        manifest: Json = json.loads(data["Manifest"])
        return ImageConfig(
            user=config.get("User", ""),
            entrypoint=tuple(config.get("Entrypoint") or ()),
            cmd=tuple(config.get("Cmd") or ()),
            env=tuple(config.get("Env") or ()),
            workdir=config.get("WorkingDir") or "/",
            layer_sizes=tuple(int(layer["size"]) for layer in manifest["layers"]),
            base_name=manifest.get("annotations", {}).get("org.opencontainers.image.base.name", ""),
            history=tuple(h.get("created_by", "") for h in data.get("History") or ()),
        )

    @contextlib.contextmanager
    def rootfs(self, image: str) -> Iterator[Path]:
        """The image's files, as a working container's mounted root (removed afterwards)."""
        name = f"gpuslice-test-{uuid.uuid4().hex[:12]}"
        self("from", "--pull=never", "--name", name, image)
        try:
            yield Path(self("mount", name).strip())
        finally:
            with contextlib.suppress(RuntimeError):
                self("umount", name)
            self("rm", name)


@dataclass(frozen=True, slots=True)
class Bind:
    source: Path
    destination: str
    readonly: bool = False


def _home_of(rootfs: Path, uid: int) -> str:
    """HOME as containerd and Docker set it: the user's passwd entry in the image, else /."""
    with contextlib.suppress(OSError):
        for line in (rootfs / "etc/passwd").read_text().splitlines():
            fields = line.split(":")
            if len(fields) >= 6 and fields[2] == str(uid):
                return fields[5]
    return "/"


def write_bundle(
    bundle: Path,
    rootfs: Path,
    config: ImageConfig,
    args: Sequence[str] | None = None,
    *,
    binds: Sequence[Bind] = (),
    env: Mapping[str, str] | None = None,
) -> None:
    """An OCI runtime bundle that runs `entrypoint + (args or cmd)` as the image's user.

    `args` replaces the image's command, as `docker run IMAGE ARGS...` or a pod's `args`
    do; the entrypoint stays.
    """
    bundle.mkdir(parents=True, exist_ok=True)
    subprocess.run(["runc", "spec", "--bundle", str(bundle)], check=True, capture_output=True)
    spec_path = bundle / "config.json"
    spec: Json = json.loads(spec_path.read_text())
    uid, gid = config.numeric_user()
    environment = list(config.env)
    if not any(e.startswith("HOME=") for e in environment):
        environment.append(f"HOME={_home_of(rootfs, uid)}")
    environment += [f"{k}={v}" for k, v in (env or {}).items()]
    spec["process"].update(
        terminal=False,
        args=[*config.entrypoint, *(config.cmd if args is None else args)],
        user={"uid": uid, "gid": gid},
        env=environment,
        cwd=config.workdir,
        noNewPrivileges=True,
        # The chart drops every capability.
        capabilities={k: [] for k in ("bounding", "effective", "permitted", "ambient")},
    )
    spec["root"] = {"path": str(rootfs), "readonly": True}
    spec["hostname"] = "gpuslice"
    spec["mounts"].append(
        {
            "destination": "/tmp",
            "type": "tmpfs",
            "source": "tmpfs",
            "options": ["nosuid", "nodev", "mode=1777", "size=16m"],
        }
    )
    for b in binds:
        spec["mounts"].append(
            {
                "destination": b.destination,
                "type": "bind",
                "source": str(b.source),
                "options": ["rbind", "ro" if b.readonly else "rw"],
            }
        )
    spec_path.write_text(json.dumps(spec, indent=1))


@dataclass(frozen=True, slots=True)
class Runc:
    """runc with a state directory of its own (not the host's /run/runc)."""

    state: Path

    def argv(self, *args: str) -> list[str]:
        return ["runc", "--root", str(self.state), *args]

    def run(self, bundle: Path, *, timeout_s: float = 60.0) -> subprocess.CompletedProcess[str]:
        """Run to completion in the foreground; stdout and stderr come back."""
        name = f"gs-{uuid.uuid4().hex[:12]}"
        try:
            return subprocess.run(
                self.argv("run", "--bundle", str(bundle), name),
                capture_output=True,
                text=True,
                check=False,
                timeout=timeout_s,
                stdin=subprocess.DEVNULL,
            )
        finally:
            self.delete(name)

    def delete(self, name: str) -> None:
        subprocess.run(self.argv("delete", "--force", name), capture_output=True, check=False)

    def pid(self, name: str) -> int:
        out = subprocess.run(
            self.argv("state", name), capture_output=True, text=True, check=True
        ).stdout
        return int(json.loads(out)["pid"])


@dataclass(slots=True)
class Container:
    """A long-running container: `runc run` in the foreground, which forwards signals to it."""

    runc: Runc
    bundle: Path
    log_path: Path
    name: str = field(default_factory=lambda: f"gs-{uuid.uuid4().hex[:12]}")
    proc: asyncio.subprocess.Process | None = None

    async def start(self) -> None:
        with self.log_path.open("ab") as log:
            self.proc = await asyncio.create_subprocess_exec(
                *self.runc.argv("run", "--bundle", str(self.bundle), self.name),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=log,
                stderr=log,
            )

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.returncode is None

    def log(self) -> str:
        try:
            return self.log_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""

    def process_ids(self) -> tuple[int, int]:
        """Real uid and gid of the container's first process, read from the host's /proc."""
        status = Path(f"/proc/{self.runc.pid(self.name)}/status").read_text()
        ids = {
            line.split(":")[0]: int(line.split()[1])
            for line in status.splitlines()
            if line.startswith(("Uid:", "Gid:"))
        }
        return ids["Uid"], ids["Gid"]

    async def terminate(self, grace_s: float = 15.0) -> int:
        """SIGTERM (the kubelet's stop), then the exit status; SIGKILL only if it overstays."""
        if self.proc is None:
            return 0
        try:
            if self.proc.returncode is None:
                self.proc.send_signal(signal.SIGTERM)
            try:
                return await asyncio.wait_for(self.proc.wait(), grace_s)
            except TimeoutError:
                self.proc.kill()
                await self.proc.wait()
                return -9
        finally:
            self.runc.delete(self.name)
