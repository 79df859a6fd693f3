"""Writing GFD labels straight onto the Node (the optional `labels.mode=api`).

The default is the NFD features.d file (`host.labelfile`), which needs no write access to
Nodes. This mode is for clusters without NFD; it needs `patch nodes`, which the chart
grants only when asked. The keys written are remembered in an annotation, so a later run
removes exactly the labels it wrote before and no longer wants (a GPU removed, sharing
turned off), and never touches labels others own (`nvidia.com/device-plugin.config`,
`nvidia.com/gpu.present`).
"""

from __future__ import annotations

from collections.abc import Mapping

from lightkube import AsyncClient
from lightkube.resources.core_v1 import Node
from lightkube.types import PatchType

MANAGED_ANNOTATION = "gpuslice.io/managed-labels"


class NodeLabeler:
    def __init__(self, client: AsyncClient, node_name: str) -> None:
        self._client = client
        self._node = node_name

    async def _managed(self) -> set[str]:
        node = await self._client.get(Node, self._node)
        annotations = (node.metadata.annotations if node.metadata is not None else None) or {}
        text = str(annotations.get(MANAGED_ANNOTATION, ""))
        return {k for k in text.split(",") if k}

    async def apply(self, labels: Mapping[str, str]) -> None:
        """Make the node carry exactly `labels` among the keys this labeler manages."""
        stale = await self._managed() - set(labels)
        patch_labels: dict[str, str | None] = dict.fromkeys(sorted(stale))
        patch_labels.update(labels)
        await self._client.patch(
            Node,
            self._node,
            {
                "metadata": {
                    "labels": patch_labels,
                    "annotations": {MANAGED_ANNOTATION: ",".join(sorted(labels))},
                }
            },
            patch_type=PatchType.MERGE,
        )

    async def clear(self) -> None:
        """Remove every label this labeler wrote (on uninstall or `labels.mode` change)."""
        stale = await self._managed()
        await self._client.patch(
            Node,
            self._node,
            {
                "metadata": {
                    "labels": dict.fromkeys(sorted(stale)),
                    "annotations": {MANAGED_ANNOTATION: None},
                }
            },
            patch_type=PatchType.MERGE,
        )
