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

from gpuslice.core.jsontypes import Json
from gpuslice.k8s.streams import list_from_cache, watch_from
from gpuslice.ports import DraConflict, DraExpired, DraObjectNotFound, SliceEvent, SliceListing


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


CLAIM_PAGE = 500
"""ResourceClaims per page of the rebuild's cluster-wide LIST (a claim is a few KiB)."""


class DraApi:
    def __init__(
        self, client: AsyncClient, node_name: str, driver: str, *, claim_page: int = CLAIM_PAGE
    ) -> None:
        if claim_page < 1:
            raise ValueError(f"DraApi claim_page {claim_page!r} must be at least 1")
        self._client = client
        self.node_name = node_name
        self.driver = driver
        self.claim_page = claim_page

    async def get_claim(self, namespace: str, name: str) -> Json:
        async with _translated(f"ResourceClaim {namespace}/{name}"):
            return _plain(await self._client.get(ResourceClaim, name, namespace=namespace))

    async def list_claims(self, uids: Collection[str] | None = None) -> list[Json]:
        """Paged (`limit`/`continue`): one page of claims is decoded at a time and only the
        wanted ones are kept, so the agent's memory does not grow with the cluster."""
        wanted = None if uids is None else frozenset(uids)
        kept: list[Json] = []
        async with _translated("ResourceClaims"):
            async for claim in self._client.list(
                ResourceClaim, namespace="*", chunk_size=self.claim_page
            ):
                meta = claim.metadata
                if wanted is None or (meta is not None and meta.uid in wanted):
                    kept.append(_plain(claim))
        return kept

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
