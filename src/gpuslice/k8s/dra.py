"""The `resource.k8s.io/v1` objects the DRA driver reads and writes, as plain JSON dicts.

The driver's rules (which slices to publish, which claim results are ours, how opaque
configs resolve) live in the pure core and work on the API's JSON shapes, so this adapter
only moves dicts: ResourceClaims are read (the kubelet sends just namespace, UID and name),
and this node's ResourceSlices of this driver are listed, created, replaced and deleted.
"""

from __future__ import annotations

from typing import Any

from lightkube import AsyncClient
from lightkube.operators import BinaryOperator, SequenceOperator
from lightkube.resources.core_v1 import Node
from lightkube.resources.resource_v1 import ResourceClaim, ResourceSlice

Json = dict[str, Any]


def _plain(obj: Any) -> Json:
    out: Json = obj.to_dict()
    return out


class DraApi:
    def __init__(self, client: AsyncClient, node_name: str, driver: str) -> None:
        self._client = client
        self.node_name = node_name
        self.driver = driver

    async def get_claim(self, namespace: str, name: str) -> Json:
        return _plain(await self._client.get(ResourceClaim, name, namespace=namespace))

    async def node_uid(self) -> str:
        node = await self._client.get(Node, self.node_name)
        return str(node.metadata.uid) if node.metadata is not None else ""

    async def list_slices(self) -> list[Json]:
        """This node's slices of this driver (the kubelet wipes the same selection)."""
        fields: dict[str, str | BinaryOperator | SequenceOperator] = {
            "spec.nodeName": self.node_name,
            "spec.driver": self.driver,
        }
        return [_plain(s) async for s in self._client.list(ResourceSlice, fields=fields)]

    async def create_slice(self, obj: Json) -> Json:
        return _plain(await self._client.create(ResourceSlice.from_dict(obj)))

    async def replace_slice(self, obj: Json) -> Json:
        """A full replace; the object's `metadata.resourceVersion` guards against a writer
        that changed it in between (the API answers 409 Conflict)."""
        name = obj["metadata"]["name"]
        return _plain(await self._client.replace(ResourceSlice.from_dict(obj), name))

    async def delete_slice(self, name: str) -> None:
        await self._client.delete(ResourceSlice, name)
