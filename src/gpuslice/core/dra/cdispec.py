"""The per-claim CDI spec: DRA's naming on the neutral CDI room (`core.cdi`).

The kubelet hands the runtime the CDI device IDs Prepare returned; the runtime finds them in
the spec files of `/var/run/cdi` and applies their edits. gpuslice writes one spec per claim
under its own kind (`k8s.gpuslice.io/claim`, never NVIDIA's), with device names that embed
the claim UID: runtimes cache specs, so a name is never reused for other content.

What each device's edits hold (device nodes, the toolkit's device-list mounts,
`NVIDIA_VISIBLE_DEVICES` per request, MPS directories, the memory-limits hook and its
variables) is the neutral room's (`core.cdi.spec`, `core.cdi.hook`), which the device
plugin's front end shares.
"""

from __future__ import annotations

from collections.abc import Sequence

from gpuslice.core.cdi.hook import CdiCaps
from gpuslice.core.cdi.spec import CdiDevice, checked_name, device_spec
from gpuslice.core.jsontypes import Json

CDI_KIND = "k8s.gpuslice.io/claim"


def cdi_name(claim_uid: str, device: str) -> str:
    return checked_name(f"{claim_uid}-{device}")


def cdi_id(claim_uid: str, device: str, kind: str = CDI_KIND) -> str:
    return f"{kind}={cdi_name(claim_uid, device)}"


def claim_spec(
    claim_uid: str,
    devices: Sequence[CdiDevice],
    *,
    host_dev_root: str = "/",
    kind: str = CDI_KIND,
    caps: CdiCaps | None = None,
    driver_from_base: bool = False,
) -> Json:
    """The spec file's content for one claim (the adapter writes it as YAML): its devices
    under names embedding the claim UID (`core.cdi.spec.device_spec` for the rest, the
    checks included: at least one device, each name one CDI allows; `driver_from_base`
    where the node's base spec, `core.cdi.driver`, is written)."""
    named = [(f"{claim_uid}-{d.device}", d) for d in devices]
    return device_spec(
        kind, named, host_dev_root=host_dev_root, caps=caps, driver_from_base=driver_from_base
    )
