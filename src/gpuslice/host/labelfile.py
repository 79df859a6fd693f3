"""The NFD `features.d` label file GFD writes (`flags.gfd.outputFile`).

NFD's worker re-reads the directory periodically; a reader must never see a half-written
file, or the node briefly loses (or mislabels) `nvidia.com/gpu.product` and pods bound
by node selectors get evicted or mis-scheduled. So the file is written to a temporary name
in the same directory and renamed over the old one (atomic on POSIX within a filesystem).
On shutdown the file is removed, as GFD does, so a node without the agent stops
advertising GPU labels.
"""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import suppress
from pathlib import Path

from gpuslice.host.atomic import atomic_write

DEFAULT_OUTPUT_FILE = Path("/etc/kubernetes/node-feature-discovery/features.d/gfd")


def render(labels: Mapping[str, str]) -> str:
    """`key=value` lines, sorted so that unchanged labels give an identical file."""
    for key, value in labels.items():
        if "\n" in key or "\n" in value or "=" in key:
            raise ValueError(f"label {key!r}={value!r} cannot be written as one key=value line")
    return "".join(f"{k}={labels[k]}\n" for k in sorted(labels))


class LabelFile:
    def __init__(self, path: Path = DEFAULT_OUTPUT_FILE) -> None:
        self.path = path

    def write(self, labels: Mapping[str, str]) -> bool:
        """Replace the file atomically; False (nothing written) when the content is the
        same, so NFD is not made to re-process an unchanged file."""
        text = render(labels)
        with suppress(OSError):
            if self.path.read_text(encoding="utf-8") == text:
                return False
        atomic_write(self.path, text.encode("utf-8"))
        return True

    def remove(self) -> None:
        """Delete the file (shutdown). Missing is fine: nothing to retract."""
        with suppress(FileNotFoundError):
            self.path.unlink()
