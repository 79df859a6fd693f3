"""In-test ClaimPreparers for the DRA gRPC tests: a recording one and deliberately broken ones."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from gpuslice.core.dra.kubelet_api import ClaimRef, PreparedDevice, PrepareResult

DRIVER = "gpu.example.com"


def claim(uid: str, name: str = "", namespace: str = "default") -> ClaimRef:
    return ClaimRef(namespace=namespace, uid=uid, name=name or f"claim-{uid}")


def device_for(uid: str) -> PreparedDevice:
    return PreparedDevice(
        request_names=("gpu",),
        pool="node-a",
        device=f"gpu-{uid}",
        cdi_ids=(f"k8s.gpu.example.com/claim={uid}",),
        share_id=f"share-{uid}",
    )


@dataclass
class RecordingPreparer:
    """Prepares every claim with one device named after its UID and records each call.

    `fail_uids` makes any batch containing one of them raise (a preparer bug or a bad
    claim); `skip_uids` are left out of the answer (a contract violation).
    """

    fail_uids: set[str] = field(default_factory=set)
    skip_uids: set[str] = field(default_factory=set)
    prepared: dict[str, ClaimRef] = field(default_factory=dict)
    prepare_calls: list[list[str]] = field(default_factory=list)
    unprepare_calls: list[list[str]] = field(default_factory=list)

    async def prepare(self, claims: Sequence[ClaimRef]) -> Mapping[str, PrepareResult]:
        self.prepare_calls.append([c.uid for c in claims])
        bad = [c.uid for c in claims if c.uid in self.fail_uids]
        if bad:
            raise RuntimeError(f"cannot prepare {bad[0]}:\nbroken")
        out: dict[str, PrepareResult] = {}
        for c in claims:
            if c.uid in self.skip_uids:
                continue
            self.prepared[c.uid] = c
            out[c.uid] = PrepareResult(devices=(device_for(c.uid),))
        return out

    async def unprepare(self, claims: Sequence[ClaimRef]) -> Mapping[str, str]:
        self.unprepare_calls.append([c.uid for c in claims])
        for c in claims:
            self.prepared.pop(c.uid, None)  # unknown claims are fine: idempotent
        return {c.uid: "" for c in claims if c.uid not in self.skip_uids}
