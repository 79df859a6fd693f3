"""DRA claims as the kubelet's PodResources `List` reports them, and books to serve them.

With DRA the kubelet lists, per container, the ResourceClaims it uses
(`ContainerResources.dynamic_resources`): each claim's namespace and name and, for every
allocated device, the driver, pool, device name, the share ID of a consumable-capacity share
and the CDI device IDs. The client flattens them into `ports.ContainerDevices` with
resource `claim:<namespace>/<name>` and device IDs `<pool>/<device>[/<shareID>]`, the
names the agent's claims plan uses (`claim_resource`, `claim_device_id`), so attribution,
the guard and the exporter treat a claim like a device-plugin resource.

`ClaimBooks` keeps which container uses which claim's devices for `PodResourcesEmulator`:
tests and `gpuslice demo` book and release claims on it as the kubelet would after
NodePrepareResources.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from gpuslice.core.dra.claimplan import CLAIM_PREFIX, claim_resource
from gpuslice.core.dra.claimplan import dra_device_id as claim_device_id

__all__ = ["CLAIM_PREFIX", "ClaimBooks", "ClaimDevice", "ContainerClaim", "claim_device_id",
           "claim_resource"]  # fmt: skip


@dataclass(frozen=True, slots=True)
class ClaimDevice:
    """One allocated device of a claim (the kubelet's `ClaimResource`)."""

    driver: str
    pool: str
    device: str
    share_id: str | None = None
    """The allocation result's `shareID` (a consumable-capacity share); None otherwise."""
    cdi_ids: tuple[str, ...] = ()
    """Fully qualified CDI device names the driver returned for it."""

    @property
    def device_id(self) -> str:
        return claim_device_id(self.pool, self.device, self.share_id)


@dataclass(frozen=True, slots=True)
class ContainerClaim:
    """One container's use of one claim (the kubelet's `DynamicResource`)."""

    namespace: str
    pod: str
    container: str
    claim_namespace: str
    claim_name: str
    devices: tuple[ClaimDevice, ...]

    @property
    def resource(self) -> str:
        return claim_resource(self.claim_namespace, self.claim_name)


ClaimDeviceSpec = tuple[str, str, str, str | None, Sequence[str]]
"""(driver, pool, device, share_id, CDI IDs): `ClaimBooks.book`'s short form."""


class ClaimBooks:
    """Which container uses which claim's devices, for `PodResourcesEmulator` to serve.

    Plain, synchronous and not thread-safe: it lives on the event loop with the emulator.
    """

    def __init__(self) -> None:
        self._entries: list[ContainerClaim] = []

    def book(
        self,
        namespace: str,
        pod: str,
        container: str,
        claim_namespace: str,
        claim_name: str,
        devices: Iterable[ClaimDevice | ClaimDeviceSpec],
    ) -> ContainerClaim:
        """Record that `container` uses the claim's `devices` (replacing an earlier booking
        of the same container and claim); returns the entry."""
        entry = ContainerClaim(
            namespace,
            pod,
            container,
            claim_namespace,
            claim_name,
            tuple(_device(d) for d in devices),
        )
        self._entries = [e for e in self._entries if not _same(e, entry)] + [entry]
        return entry

    def release_claim(self, claim_namespace: str, claim_name: str) -> int:
        """Forget every container's use of the claim (it was unprepared); how many went."""
        before = len(self._entries)
        self._entries = [
            e
            for e in self._entries
            if (e.claim_namespace, e.claim_name) != (claim_namespace, claim_name)
        ]
        return before - len(self._entries)

    def remove_pod(self, namespace: str, pod: str) -> int:
        """Forget the pod's claim uses (the pod was deleted); how many went."""
        before = len(self._entries)
        self._entries = [e for e in self._entries if (e.namespace, e.pod) != (namespace, pod)]
        return before - len(self._entries)

    def entries(self) -> tuple[ContainerClaim, ...]:
        return tuple(self._entries)


def _device(d: ClaimDevice | ClaimDeviceSpec) -> ClaimDevice:
    if isinstance(d, ClaimDevice):
        return d
    driver, pool, device, share_id, cdi_ids = d
    return ClaimDevice(driver, pool, device, share_id or None, tuple(cdi_ids))


def _same(a: ContainerClaim, b: ContainerClaim) -> bool:
    return (a.namespace, a.pod, a.container, a.claim_namespace, a.claim_name) == (
        b.namespace,
        b.pod,
        b.container,
        b.claim_namespace,
        b.claim_name,
    )
