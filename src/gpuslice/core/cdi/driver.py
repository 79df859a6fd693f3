"""The node's base CDI spec: the driver's files, once per container, as NVIDIA's DRA driver
writes them in its "standard" spec.

A container may hold several claims, each with its own claim spec. What makes a GPU
visible adds up over them (device nodes), but an environment variable does not: with each
claim's spec setting `NVIDIA_VISIBLE_DEVICES` to its own GPUs, the last one applied wins and
the toolkit's legacy hook injects only those. NVIDIA's driver therefore never names a GPU in
that variable: its base spec (`cmd/gpu-kubelet-plugin/cdi.go`, `CreateStandardDeviceSpecFile`,
before the claim spec took the edits over) carries the toolkit's common edits (`nvcdi`
`GetCommonEdits`: the driver's libraries, binaries, firmware and IPC sockets, the hooks
that link and cache the libraries) and `NVIDIA_VISIBLE_DEVICES=void`, so the toolkit's
runtime adds nothing, and Prepare returns, per device, the base spec's ID beside the
claim's. The runtime applies a spec's common edits once per container (the CDI library's
injection), however many claims name it.

This module holds which files are the driver's (the names and where the toolkit looks, for
the host adapter `host.driverfiles` that finds them) and builds the spec from what was
found. gpuslice's base spec has one device, `driver`, whose edits are the control device
nodes (every container with a GPU needs them, and a CDI device needs an edit of its own);
the rest are the spec's common edits. Each claim's GPU device nodes, MIG capability nodes,
MPS mounts and memory-caps hook stay in its claim spec (`core.cdi.spec`): they belong to
the claim and live as long as it, where the base spec is the node's and outlives every
claim. A MIG device made at Prepare (dynamic MIG) could not be in a spec written before it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from fnmatch import fnmatchcase
from pathlib import PurePosixPath

from gpuslice.core.cdi.hook import hook_argv
from gpuslice.core.cdi.spec import device_node, minimum_version
from gpuslice.core.jsontypes import Json

BASE_KIND = "k8s.gpuslice.io/device"
"""The base spec's kind: gpuslice's own, never NVIDIA's (`k8s.gpu.nvidia.com/device`)."""
BASE_SPEC = "base"
"""The base spec's name among the kind's files (`k8s.gpuslice.io-device_base.yaml`), the
same across restarts: a prepared claim's IDs name it until the claim is unprepared."""
BASE_DEVICE = "driver"
BASE_ID = f"{BASE_KIND}={BASE_DEVICE}"
"""The CDI ID Prepare returns for every device beside the claim spec's."""

LIBRARY_DIRS = (
    "usr/lib64",
    "usr/lib/x86_64-linux-gnu",
    "usr/lib/aarch64-linux-gnu",
    "lib64",
    "lib/x86_64-linux-gnu",
    "lib/aarch64-linux-gnu",
    "usr/lib",
)
"""Where a driver installation puts its libraries (under the driver root), and each one's
`vdpau` directory: what the toolkit's library locator searches besides the ldcache."""
LEGACY_LIBRARIES = ("libnvidia-nvvm70.so.*",)
"""Libraries of the driver without its version suffix (`getLegacyNVVMLibraryMounts`)."""
BINARIES = (
    "nvidia-smi",
    "nvidia-debugdump",
    "nvidia-persistenced",
    "nvidia-cuda-mps-control",
    "nvidia-cuda-mps-server",
    "nvidia-imex",
    "nvidia-imex-ctl",
)
"""The driver's programs a container gets (`newDriverBinariesDiscoverer`)."""
BINARY_DIRS = ("usr/local/sbin", "usr/local/bin", "usr/sbin", "usr/bin", "sbin", "bin")
"""The toolkit's executable search path, under the driver root (`lookup.defaultPATH`)."""
SOCKETS = (
    "run/nvidia-persistenced/socket",
    "var/run/nvidia-persistenced/socket",
    "run/nvidia-fabricmanager/socket",
    "var/run/nvidia-fabricmanager/socket",
)
"""The driver daemons' IPC sockets (`NewIPCDiscoverer`, first found of each). The toolkit's
`/tmp/nvidia-mps` is left out: a claim's MPS pipe is its own daemon's (`core.cdi.spec`)."""
FIRMWARE_DIR = "lib/firmware/nvidia"
FIRMWARE_FILES = "gsp*.bin"
"""GSP firmware, in `<FIRMWARE_DIR>/<version>/` (`newDriverFirmwareDiscoverer`)."""
CONTROL_NODES = ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset")
"""The control device nodes (`controlDeviceNodeDiscoverer`), those the host has."""

FILE_OPTIONS = ("ro", "nosuid", "nodev", "rbind", "rprivate")
SOCKET_OPTIONS = ("nosuid", "nodev", "rbind", "rprivate", "noexec")
HOOK_LIFECYCLE = "createContainer"
"""The toolkit's stage for the library hooks (`getOCIHookType`)."""


def is_driver_library(name: str, version: str) -> bool:
    """A file the base spec mounts from a library directory: one ending in the driver's
    version (`*.so.<version>`, `getVersionLibs`), or a legacy library."""
    return name.endswith(f".so.{version}") or any(fnmatchcase(name, p) for p in LEGACY_LIBRARIES)


def firmware_dir(version: str) -> str:
    return f"{FIRMWARE_DIR}/{version}"


@dataclass(frozen=True, slots=True)
class DriverFiles:
    """What the host adapter found under the driver root: paths relative to it (they are
    the container paths too, as the toolkit mounts them)."""

    version: str
    libraries: tuple[str, ...]
    links: tuple[tuple[str, str], ...] = ()
    """(target, link) of the host's symlinks to a library in its directory (`libcuda.so.1`
    -> `libcuda.so.550.54.15`), which the toolkit's `create-symlinks` hook makes in the
    container (`getDotSoSymlinks`)."""
    binaries: tuple[str, ...] = ()
    firmware: tuple[str, ...] = ()
    sockets: tuple[str, ...] = ()
    control_nodes: tuple[str, ...] = ()
    """Control device nodes found under the dev root (`CONTROL_NODES`)."""

    def missing(self) -> str:
        """What the base spec cannot do without, "" when nothing: the CUDA driver library
        (every CUDA program loads it) and the control node `nvidiactl`."""
        gaps = []
        if not any(PurePosixPath(p).name.startswith("libcuda.so.") for p in self.libraries):
            gaps.append(f"libcuda.so.{self.version}")
        if "nvidiactl" not in self.control_nodes:
            gaps.append("/dev/nvidiactl")
        return ", ".join(gaps)


def _host(root: str, relative: str) -> str:
    return f"{root.rstrip('/')}/{relative}"


def _hook(hook_path: str, name: str, args: Sequence[str]) -> Json:
    """An `nvidia-cdi-hook` entry as the toolkit writes it (`core.cdi.hook.hook_argv`)."""
    return {
        "hookName": HOOK_LIFECYCLE,
        "path": hook_path,
        "args": [*hook_argv(hook_path, name), *args],
    }


def library_hooks(files: DriverFiles, hook_path: str) -> list[Json]:
    """The toolkit's hooks for the mounted libraries (`NewDriverLibraryDiscoverer`): the
    symlinks (`libcuda.so` -> `libcuda.so.1` always, the host's links beside), the CUDA
    forward compatibility check against the host driver, the ldcache update over the
    libraries' directories, and no device node made by the driver inside the container."""
    links: list[str] = []
    for lib in files.libraries:
        path = PurePosixPath("/" + lib)
        if path.name == f"libcuda.so.{files.version}":
            links.append(f"libcuda.so.1::{path.parent / 'libcuda.so'}")
    for target, link in files.links:
        links.append(f"{target}::/{link}")
    folders = list(dict.fromkeys(str(PurePosixPath("/" + lib).parent) for lib in files.libraries))
    hooks = []
    if links:
        link_args = [a for lk in links for a in ("--link", lk)]
        hooks.append(_hook(hook_path, "create-symlinks", link_args))
    hooks.append(_hook(hook_path, "enable-cuda-compat", [f"--host-driver-version={files.version}"]))
    hooks.append(_hook(hook_path, "update-ldcache", [a for f in folders for a in ("--folder", f)]))
    hooks.append(_hook(hook_path, "disable-device-node-modification", []))
    return hooks


def base_spec(
    files: DriverFiles,
    *,
    host_driver_root: str,
    host_dev_root: str = "/",
    hook_path: str,
    kind: str = BASE_KIND,
) -> Json:
    """The base spec file's content (the adapter writes it as YAML). `host_driver_root`
    is the driver root on the host (`nvidiaDriverRoot`: the mounts' `hostPath`, as NVIDIA's
    `transformroot` gives them), `host_dev_root` where the device nodes are on the host
    (`host.devroot`), `hook_path` the toolkit's `nvidia-cdi-hook` as the runtime runs it."""
    if files.missing():
        raise ValueError(f"no base spec without {files.missing()}")
    mounts: list[Json] = [
        {"hostPath": _host(host_driver_root, p), "containerPath": f"/{p}",
         "options": list(FILE_OPTIONS)}
        for p in (*files.libraries, *files.firmware, *files.binaries)
    ]  # fmt: skip
    mounts += [
        {"hostPath": _host(host_driver_root, p), "containerPath": f"/{p}",
         "options": list(SOCKET_OPTIONS)}
        for p in files.sockets
    ]  # fmt: skip
    cuda_dirs = dict.fromkeys(
        str(PurePosixPath("/" + p).parent)
        for p in files.libraries
        if PurePosixPath(p).name.startswith("libcuda.so.")
    )
    env = ["NVIDIA_VISIBLE_DEVICES=void", f"NVIDIA_CTK_LIBCUDA_DIR={':'.join(cuda_dirs)}"]
    nodes = [device_node(n, host_dev_root) for n in files.control_nodes]
    devices: list[Json] = [{"name": BASE_DEVICE, "containerEdits": {"deviceNodes": nodes}}]
    return {
        "cdiVersion": minimum_version(devices),
        "kind": kind,
        "devices": devices,
        "containerEdits": {
            "env": env,
            "mounts": mounts,
            "hooks": library_hooks(files, hook_path),
        },
    }
