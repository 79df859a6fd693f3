"""The `resource.k8s.io/v1` objects the DRA driver reads and writes, as plain JSON dicts.

The driver's rules (which slices to publish, which claim results are ours, how opaque
configs resolve) live in the pure core and work on the API's JSON shapes, so this adapter
only moves dicts: ResourceClaims are read (the kubelet sends just namespace, UID and name),
and this node's ResourceSlices of this driver are listed, created, replaced and deleted.
It implements `ports.DraObjects`; 404 and 409 become the port's exceptions, 410 on a watch
`DraExpired`.

The slices are listed from the watch cache and watched with bookmarks (`k8s.streams`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Collection
from contextlib import asynccontextmanager
from typing import Any

from lightkube import AsyncClient
from lightkube.core.exceptions import ApiError
from lightkube.operators import BinaryOperator, SequenceOperator
from lightkube.resources.core_v1 import Node
from lightkube.resources.resource_v1 import ResourceClaim, ResourceSlice

from gpuslice.core.dra import resource_claim
from gpuslice.core.dra.claim_list import read_page
from gpuslice.core.jsontypes import Json
from gpuslice.k8s.streams import list_from_cache, list_page, watch_from
from gpuslice.logs import get_logger
from gpuslice.ports import DraConflict, DraExpired, DraObjectNotFound, SliceEvent, SliceListing

log = get_logger("gpuslice.dra.api")


class ClaimUnreadable(Exception):
    """A ResourceClaim asked for by UID could not be decoded."""


def _plain(obj: Any) -> Json:
    out: Json = obj.to_dict()
    return out


@asynccontextmanager
async def _translated(what: str) -> AsyncIterator[None]:
    try:
        yield
    except ApiError as exc:
        code = getattr(exc.status, "code", None)
        if code == 404:
            raise DraObjectNotFound(f"{what} not found") from exc
        if code == 409:
            raise DraConflict(f"{what}: {exc.status.message}") from exc
        raise


CLAIM_PAGE = 100
"""ResourceClaims asked for per page of the rebuild's cluster-wide LIST. A claim is a few
KiB, but a tenant may make one of up to the API server's object limit (about 1.5 MiB in
etcd): 500 large claims made a page of 160 MB, beyond the agent's memory limit."""
CLAIM_PAGE_BYTES = 8 * 1024 * 1024
"""The most bytes of one page read: a page that would be larger is read again with half
as many claims, down to one (which always fits)."""


class ClaimListTooLarge(Exception):
    """One claim alone was larger than the page bound: not something a server sends."""


class DraApi:
    def __init__(
        self,
        client: AsyncClient,
        node_name: str,
        driver: str,
        *,
        claim_page: int = CLAIM_PAGE,
        claim_page_bytes: int = CLAIM_PAGE_BYTES,
    ) -> None:
        if claim_page < 1:
            raise ValueError(f"DraApi claim_page {claim_page!r} must be at least 1")
        if claim_page_bytes < 1:
            raise ValueError(f"DraApi claim_page_bytes {claim_page_bytes!r} must be at least 1")
        self._client = client
        self.node_name = node_name
        self.driver = driver
        self.claim_page = claim_page
        self.claim_page_bytes = claim_page_bytes
        self.largest_page_read = 0
        """Bytes of the largest claim page read whole (what tests hold to the bound)."""

    async def get_claim(self, namespace: str, name: str) -> Json:
        async with _translated(f"ResourceClaim {namespace}/{name}"):
            return _plain(await self._client.get(ResourceClaim, name, namespace=namespace))

    async def list_claims(self, uids: Collection[str] | None = None) -> list[Json]:
        """Paged (`limit`/`continue`), each page read up to `claim_page_bytes` (a larger one
        is asked for again with half the claims) and walked claim by claim
        (`core.dra.claim_list`): only the wanted claims are kept, so memory is bounded
        whatever the cluster holds, and a claim that cannot be decoded (a tenant's nesting
        bomb) is logged and skipped, costing only itself. One the caller asked for by UID
        raises instead: nothing may be taken for not prepared because it was not read."""
        wanted = None if uids is None else frozenset(uids)
        kept: list[Json] = []
        limit, token = self.claim_page, ""
        async with _translated("ResourceClaims"):
            while True:
                body = await list_page(
                    self._client, ResourceClaim, limit, token, max_bytes=self.claim_page_bytes
                )
                if body is None:
                    if limit == 1:
                        raise ClaimListTooLarge(
                            f"one ResourceClaim is over {self.claim_page_bytes} bytes"
                        )
                    limit = max(1, limit // 2)
                    continue
                self.largest_page_read = max(self.largest_page_read, len(body))
                page = read_page(body.decode("utf-8", errors="replace"))
                for claim in page.items:
                    uid = resource_claim.ResourceClaim.read(claim).uid
                    if wanted is None or uid in wanted:
                        kept.append(claim)
                for bad in page.unreadable:
                    log.warning(
                        "dra-claim-unreadable",
                        claim_uid=bad.uid or "?",
                        claim=f"{bad.namespace or '?'}/{bad.name or '?'}",
                        error=bad.error,
                    )
                    # one of ours read at its Prepare (a claim's spec never changes)
                    if wanted is not None and bad.uid in wanted:
                        raise ClaimUnreadable(
                            f"ResourceClaim {bad.namespace}/{bad.name} ({bad.uid}) cannot be "
                            f"read: {bad.error}"
                        )
                if not page.continue_token:
                    return kept
                token = page.continue_token

    async def node_uid(self) -> str:
        async with _translated(f"Node {self.node_name}"):
            node = await self._client.get(Node, self.node_name)
        return str(node.metadata.uid) if node.metadata is not None else ""

    async def list_slices(self) -> list[Json]:
        """This node's slices of this driver (the kubelet wipes the same selection), read
        consistently: used after a write lost a race, where a cached view could be the very
        version that lost."""
        fields: dict[str, str | BinaryOperator | SequenceOperator] = {
            "spec.nodeName": self.node_name,
            "spec.driver": self.driver,
        }
        return [_plain(s) async for s in self._client.list(ResourceSlice, fields=fields)]

    def _selector(self) -> str:
        return f"spec.nodeName={self.node_name},spec.driver={self.driver}"

    async def listed_slices(self) -> SliceListing:
        """From the watch cache (`k8s.streams`): the version it returns is one a watch can
        start from at once."""
        items, version = await list_from_cache(self._client, ResourceSlice, fields=self._selector())
        return SliceListing([_plain(s) for s in items], version)

    async def watch_slices(self, resource_version: str) -> AsyncIterator[SliceEvent]:
        events = watch_from(
            self._client, ResourceSlice, resource_version, fields=self._selector(), as_dicts=True
        )
        try:
            async for kind, obj in events:
                yield SliceEvent(kind, dict(obj.to_dict()))
        except ApiError as exc:
            code = getattr(exc.status, "code", None)
            message = str(getattr(exc.status, "message", "") or "")
            if code == 410 or (code == 504 and "Too large resource version" in message):
                # gone from the server's history, or ahead of its cache: list again
                raise DraExpired(message) from exc
            raise
        finally:
            await events.aclose()

    async def create_slice(self, obj: Json) -> Json:
        async with _translated("ResourceSlice"):
            return _plain(await self._client.create(ResourceSlice.from_dict(obj)))

    async def replace_slice(self, obj: Json) -> Json:
        """A full replace; the object's `metadata.resourceVersion` guards against a writer
        that changed it in between (the API answers 409 Conflict: DraConflict)."""
        name = obj["metadata"]["name"]
        async with _translated(f"ResourceSlice {name}"):
            return _plain(await self._client.replace(ResourceSlice.from_dict(obj), name))

    async def delete_slice(self, name: str) -> None:
        async with _translated(f"ResourceSlice {name}"):
            await self._client.delete(ResourceSlice, name)
