"""Writing GFD labels straight onto the Node (the optional `labels.mode=api`).

The default is the NFD features.d file (`host.labelfile`), which needs no write access to
Nodes. This mode is for clusters without NFD; it needs `patch nodes`, which the chart
grants only when asked, and an admission policy then lets the agent change nothing of its
Node but `nvidia.com/` labels: not even an annotation. So the labels are written by
server-side apply under the field manager `gpuslice`: the API server remembers which labels
this manager applied, removes the ones a later apply no longer carries (a GPU removed,
sharing turned off) and never touches labels others own (`nvidia.com/device-plugin.config`,
`nvidia.com/gpu.present`). Earlier versions kept that list in the annotation
`gpuslice.io/managed-labels`: labels they wrote belong to no manager and stay until removed
by hand (docs/install.md, "Upgrade").
"""

from __future__ import annotations

from collections.abc import Mapping

from lightkube import AsyncClient
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Node

FIELD_MANAGER = "gpuslice"


class NodeLabeler:
    def __init__(self, client: AsyncClient, node_name: str) -> None:
        self._client = client
        self._node = node_name

    async def apply(self, labels: Mapping[str, str]) -> None:
        """Make the node carry exactly `labels` among the labels this agent applies."""
        body = Node(metadata=ObjectMeta(name=self._node, labels=dict(labels)))
        await self._client.apply(body, field_manager=FIELD_MANAGER, force=True)

    async def clear(self) -> None:
        """Remove every label this agent applied (on uninstall or `labels.mode` change)."""
        await self.apply({})
