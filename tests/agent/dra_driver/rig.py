"""The DRA driver's test rig: a simulated node's plan, the DRA store double and the host
directories a driver prepares claims into."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpuslice.agent.dra_driver import DraDriver, DriverSettings
from gpuslice.agent.dra_slices import SlicePublisher
from gpuslice.core.dra.cdispec import CDI_KIND
from gpuslice.core.dra.kubelet_api import ClaimRef
from gpuslice.core.dra.prepared import _checksum
from gpuslice.core.jsontypes import Json
from gpuslice.emulator.dra_store import DraStore
from gpuslice.host.cdi_store import CdiSpecStore
from gpuslice.host.checkpoint_file import CheckpointFile
from gpuslice.mps import MpsDaemonManager
from gpuslice.state import PlanState

DRIVER = "gpu.nvidia.com"
NODE = "n1"
FAKE_MPS = (sys.executable, "-m", "gpuslice.emulator.fake_mps_control")
GPU_CLASS = {
    "metadata": {"name": "gpu.nvidia.com"},
    "spec": {
        "selectors": [
            {
                "cel": {
                    "expression": "device.driver == 'gpu.nvidia.com' && "
                    "device.attributes['gpu.nvidia.com'].type == 'gpu'"
                }
            }
        ]
    },
}


@dataclass
class Rig:
    store: DraStore
    state: PlanState
    workdir: Path
    boot: list[str] = field(default_factory=lambda: ["boot-1"])
    warnings: list[tuple[str, str]] = field(default_factory=list)
    mps: MpsDaemonManager | None = None
    timeslice: Any = None
    compute_mode: Any = None
    old_name: str = "pre-rename-checkpoint.json"
    """Where an earlier build kept the record (`checkpoint.json` in the agent)."""

    def driver(self, *, mps_root: Path | None = None, **settings: Any) -> DraDriver:
        """The driver on this rig; `settings` override `DriverSettings`' defaults."""

        async def warn(reason: str, message: str) -> None:
            self.warnings.append((reason, message))

        root = self.workdir / "mps" if mps_root is None else mps_root
        return DraDriver(
            DriverSettings(DRIVER, NODE, mps_root=str(root), **settings),
            objects=self.store,
            checkpoint=CheckpointFile(self.workdir / "checkpoint.json"),
            cdi=CdiSpecStore(self.workdir / "cdi", CDI_KIND),
            snapshot=lambda: self.state.current,
            boot_id=self.boot[0],
            mps=self.mps,
            timeslice=self.timeslice,
            warn=warn,
            old_checkpoint=CheckpointFile(self.workdir / self.old_name),
            compute_mode=self.compute_mode,
        )

    async def publish(self) -> None:
        await SlicePublisher(
            self.store, driver=DRIVER, node=NODE, snapshot=lambda: self.state.current
        ).publish_once()

    def claim(self, name: str, *parameters: Json) -> ClaimRef:
        """Create and allocate a one-GPU claim with these opaque config parameters."""
        devices: Json = {
            "requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}],
            "config": [{"opaque": {"driver": DRIVER, "parameters": p}} for p in parameters],
        }
        obj = {"metadata": {"name": name, "namespace": "team-a"}, "spec": {"devices": devices}}
        created = self.store.add_claim(obj)
        self.store.allocate_claim("team-a", name, pod_uid=f"uid-{name}")
        return ClaimRef("team-a", created["metadata"]["uid"], name)

    def edit_checkpoint(self, edit: Callable[[Json], None]) -> None:
        """Change the stored record's data as another writer would, checksum kept valid."""
        path = self.workdir / "checkpoint.json"
        doc = json.loads(path.read_text("utf-8"))
        edit(doc["data"])
        doc["checksum"] = _checksum(doc["data"])
        path.write_text(json.dumps(doc), "utf-8")

    def cdi_files(self) -> set[str]:
        root = self.workdir / "cdi"
        return {p.name for p in root.iterdir()} if root.exists() else set()
