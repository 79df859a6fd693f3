"""List from the API server's watch cache, then watch with bookmarks: how every watcher here
keeps a view current without polling.

lightkube's `list()` reads from etcd and its `watch()` cannot ask for bookmarks, which costs
twice at rest:

* A version read from etcd can be ahead of the watch cache, which then holds the watch until
  its progress catches up and fails it with "Too large resource version" (with an etcd that
  sends no progress notifications, until the next write of that resource anywhere). A list
  with `resourceVersion=0` is served by the cache, as informers list, and is cheaper.
* Without bookmarks a watch that sees no change resumes, each time the server ends it, from
  the version it started at; once the server's history has moved past that version the
  resume gets 410 Gone and a LIST follows. With bookmarks the version moves on while nothing
  changes.

Both are built with lightkube's own request builder and streamed by its own watch loop, which
re-opens a stream the server ended from the last version seen (bookmarks included); only
the query parameters differ from its public calls. BOOKMARK events reach the caller (kind
"BOOKMARK", an object with only `metadata.resourceVersion`), who skips them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncGenerator
from typing import Any

from lightkube import AsyncClient
from lightkube.generic_resource import Generic

BOOKMARK = "BOOKMARK"


def _generic(client: AsyncClient) -> Any:
    return client._client


async def list_from_cache(
    client: AsyncClient,
    resource: Any,
    *,
    namespace: str | None = None,
    fields: str = "",
) -> tuple[list[Any], str]:
    """The objects (typed) and the list's resourceVersion, read from the watch cache."""
    params = {"resourceVersion": "0", "fieldSelector": fields or None}
    request = _generic(client).prepare_request(
        "list", res=resource, namespace=namespace, params=params
    )
    listing = _generic(client).list(request)
    items = [obj async for obj in listing]
    return items, str(listing.resourceVersion)


async def list_page(
    client: AsyncClient, resource: Any, limit: int, token: str, *, max_bytes: int
) -> bytes | None:
    """One page of a cluster-wide LIST (`limit`, `continue`), as the server's bytes, for a
    caller that decodes it itself; None once it is over `max_bytes` (read no further).
    lightkube decodes a whole page at once, unbounded: one object it cannot decode loses
    the page, and a page of large objects can be any size."""
    params = {"limit": limit, "continue": token or None}
    generic = _generic(client)
    request = generic.build_adapter_request(
        generic.prepare_request("list", res=resource, namespace="*", params=params)
    )
    response = await generic.send(request, stream=True)
    try:
        if response.is_error:
            await response.aread()  # an error's Status, which the server keeps small
            generic.raise_for_status(response)
        chunks: list[bytes] = []
        size = 0
        async for chunk in response.aiter_bytes():
            size += len(chunk)
            if size > max_bytes:
                return None
            chunks.append(chunk)
    finally:
        await response.aclose()
    return b"".join(chunks)


async def watch_from(
    client: AsyncClient,
    resource: Any,
    resource_version: str,
    *,
    namespace: str | None = None,
    fields: str = "",
    server_timeout_s: int | None = None,
    as_dicts: bool = False,
) -> AsyncGenerator[tuple[str, Any], None]:
    """(kind, object) for each event after `resource_version`, bookmarks included, always
    as plain dicts (`Generic`: `.metadata` still reads as a model); other objects typed as
    `resource`, or plain dicts with `as_dicts`. Errors (410 Gone among them) are
    lightkube's `ApiError`; the stream is closed when the caller stops iterating."""
    params = {
        "resourceVersion": resource_version,
        "allowWatchBookmarks": "true",
        "fieldSelector": fields or None,
        "timeoutSeconds": server_timeout_s,
    }
    request = _generic(client).prepare_request(
        "list", res=resource, namespace=namespace, watch=True, params=params
    )
    # Decoded as plain dicts first: the real server's bookmark is the kind's empty object
    # (a Pod's `spec.containers` is null), which the typed models refuse; only the other
    # events are typed, when the caller wants them typed.
    plain: Any = Generic
    request = dataclasses.replace(request, response_type=plain)
    events = _generic(client).watch(request)
    try:
        async for kind, obj in events:
            if as_dicts or kind == BOOKMARK:
                yield str(kind), obj
            else:
                yield str(kind), resource.from_dict(dict(obj))
    finally:
        await events.aclose()
