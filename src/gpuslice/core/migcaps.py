"""MIG capability device nodes: what a container needs, besides its GPU's `/dev/nvidia<N>`,
to open a MIG device.

The driver guards each GPU instance and each compute instance with a capability device,
`/dev/nvidia-caps/nvidia-cap<minor>`; a container that lacks the two of its MIG device (its
GI's and its CI's) cannot use it. The minor of each is the `DeviceFileMinor: <N>` line of
its access file, `/proc/driver/nvidia/capabilities/gpu<GPU minor>/mig/gi<GI>/access` and
`.../gi<GI>/ci<CI>/access`; NVIDIA's DRA driver reads those (`GetDevNodesForMigDevice`,
`internal/common/nvcaps.go`). The backend reads them (an adapter); this module only names
the files, parses their text and says which nodes follow, so the core stays pure.

The driver numbers the minors in a fixed order, listed in
`/proc/driver/nvidia-caps/mig-minors` (`gpu0/gi0/access 3`, `gpu0/gi0/ci0/access 4`, ...,
`gpu3/gi3/ci3/access 439`): 15 GPU instances per GPU, 8 compute instances per GPU instance.
`numbered_minors` is that order, which the simulated backend uses as its driver's.

NVIDIA's spec gives those nodes as character devices by number (`type: c`, the `nvidia-caps`
major from `/proc/devices`, the minor), so the runtime creates them in the container and the
host needs no such node; gpuslice does the same when the backend read the major, and names
the host's node (under the dev root) otherwise.
"""

from __future__ import annotations

PROC_CAPABILITIES = "/proc/driver/nvidia/capabilities"
CAPS_DEV_DIR = "nvidia-caps"
"""Under `/dev`: where the capability device nodes are."""
_FIRST_MIG_MINOR = 3
"""`config` is 1 and `monitor` 2; MIG access files follow."""
_GI_PER_GPU = 15
_CI_PER_GI = 8


def access_files(gpu_minor: int, gi_id: int, ci_id: int) -> tuple[str, str]:
    """The access files of a MIG device's GPU instance and compute instance."""
    gi = f"{PROC_CAPABILITIES}/gpu{gpu_minor}/mig/gi{gi_id}/access"
    return gi, f"{PROC_CAPABILITIES}/gpu{gpu_minor}/mig/gi{gi_id}/ci{ci_id}/access"


def device_file_minor(text: str) -> int:
    """The `DeviceFileMinor: <N>` of an access file's text; ValueError when it has none."""
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() == "DeviceFileMinor":
            return int(value.strip())
    raise ValueError("no DeviceFileMinor line")


def numbered_minors(gpu_minor: int, gi_id: int, ci_id: int) -> tuple[int, int]:
    """The (GI, CI) capability minors in the driver's fixed numbering (`mig-minors`)."""
    gi = _FIRST_MIG_MINOR + (gpu_minor * _GI_PER_GPU + gi_id) * (_CI_PER_GI + 1)
    return gi, gi + 1 + ci_id


def char_major(proc_devices: str, name: str = "nvidia-caps") -> int | None:
    """The major of character device `name` in `/proc/devices`' text (its "Character
    devices:" section, not the block devices'); None when it is not there."""
    section = ""
    for line in proc_devices.splitlines():
        stripped = line.strip()
        if stripped.endswith(":"):
            section = stripped
            continue
        number, _, device = stripped.partition(" ")
        if section == "Character devices:" and device.strip() == name and number.isdigit():
            return int(number)
    return None


def cap_node(minor: int) -> str:
    """The device node's name under `/dev`."""
    return f"{CAPS_DEV_DIR}/nvidia-cap{minor}"
