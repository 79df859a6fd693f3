"""`nvidia-smi compute-policy --set-timeslice` through a scripted nvidia-smi."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from gpuslice.mps import MpsError
from gpuslice.nvsmi import NvidiaSmi

# argv: log, outcome, then nvidia-smi's own arguments
FAKE_SMI = """
import sys
log, outcome, args = sys.argv[1], sys.argv[2], sys.argv[3:]
with open(log, "a") as f:
    f.write(" ".join(args) + "\\n")
if outcome == "unsupported":
    print("Setting time-slice is not supported on GPU 00000000:00:04.0.", file=sys.stderr)
    sys.exit(3)
"""
UUID = "GPU-aaaaaaaa-1111-2222-3333-444444444444"


def smi(tmp_path: Path, outcome: str) -> tuple[NvidiaSmi, Path]:
    log = tmp_path / "smi.log"
    return NvidiaSmi((sys.executable, "-c", FAKE_SMI, str(log), outcome)), log


async def test_sets_the_interval_with_nvidia_smis_arguments(tmp_path: Path) -> None:
    setter, log = smi(tmp_path, "ok")
    await setter.set_timeslice(UUID, 3)
    assert log.read_text().splitlines() == [f"compute-policy -i {UUID} --set-timeslice 3"]


async def test_an_unsupported_gpu_is_reported_with_the_tools_message(tmp_path: Path) -> None:
    setter, _log = smi(tmp_path, "unsupported")
    with pytest.raises(MpsError, match="Setting time-slice is not supported on GPU"):
        await setter.set_timeslice(UUID, 1)


@pytest.mark.parametrize("bad", [-1, 4])
async def test_an_interval_outside_0_to_3_never_reaches_the_tool(tmp_path: Path, bad: int) -> None:
    setter, log = smi(tmp_path, "ok")
    with pytest.raises(MpsError, match="must be 0-3"):
        await setter.set_timeslice(UUID, bad)
    assert not log.exists()
