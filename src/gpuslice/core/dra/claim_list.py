"""One page of a ResourceClaim LIST, read claim by claim.

The record rebuild lists every claim of the cluster (`k8s.dra.DraApi.list_claims`), and any
tenant can create a claim: its opaque parameters are free-form JSON, which the API server
stores up to 10,000 levels deep. Decoding a page as one document, as a client library does,
lets one such claim (3 KB, 1,500 arrays deep) fail the page with a `RecursionError`, and with
it the whole rebuild, for as long as the claim exists. So the page is walked here: its
`items` are decoded one at a time, and an item that cannot be decoded is stepped over by a
scan that keeps no stack (it counts brackets outside strings), named by what can be read of
it, and costs only itself.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from gpuslice.core.jsontypes import Json

_SPACE = re.compile(r"[ \t\n\r]*")
_TOKEN = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{}]')
"""A JSON string (escapes included) or a bracket: what the stackless scan steps through."""
_FIELD = {
    key: re.compile(rf'"{key}"\s*:\s*"([^"\\]{{1,253}})"') for key in ("uid", "namespace", "name")
}
MAX_NESTING = 128
"""The deepest claim read. A claim is a few dozen levels deep at most (its managed fields,
its opaque parameters); one deeper is unreadable by this bound, checked by the stackless
scan before decoding, not by whether the decoder happens to hit the interpreter's recursion
limit (which the call's own stack depth and anything that raised the limit move)."""
IDENTITY_WINDOW = 4096
"""How far into an unreadable item its identity is looked for (the server writes
`metadata` first)."""


@dataclass(frozen=True, slots=True)
class Unreadable:
    """An item of the page that could not be decoded, as far as it can be named."""

    uid: str
    namespace: str
    name: str
    error: str


@dataclass(frozen=True, slots=True)
class ClaimPage:
    items: tuple[Json, ...]
    unreadable: tuple[Unreadable, ...]
    continue_token: str
    """The next page's `continue` ("" on the last page)."""


def read_page(text: str) -> ClaimPage:
    """The page's claims, those that could not be read, and its `continue` token. A page
    whose own structure is broken (not one a server sends) raises ValueError."""
    decoder = json.JSONDecoder()
    pos = _expect(text, _skip_space(text, 0), "{")
    items: list[Json] = []
    unreadable: list[Unreadable] = []
    metadata: object = {}
    first = True
    while True:
        pos = _skip_space(text, pos)
        if text.startswith("}", pos):
            break
        if not first:
            pos = _skip_space(text, _expect(text, pos, ","))
        first = False
        key, pos = decoder.raw_decode(text, pos)
        pos = _skip_space(text, _expect(text, _skip_space(text, pos), ":"))
        if key == "items":
            pos = _items(text, pos, decoder, items, unreadable)
        else:
            value, pos = decoder.raw_decode(text, pos)
            if key == "metadata":
                metadata = value
    token = metadata.get("continue") if isinstance(metadata, dict) else None
    return ClaimPage(tuple(items), tuple(unreadable), token if isinstance(token, str) else "")


def _items(
    text: str,
    pos: int,
    decoder: json.JSONDecoder,
    items: list[Json],
    unreadable: list[Unreadable],
) -> int:
    if text.startswith("null", pos):
        return pos + 4
    pos = _expect(text, pos, "[")
    first = True
    while True:
        pos = _skip_space(text, pos)
        if text.startswith("]", pos):
            return pos + 1
        if not first:
            pos = _skip_space(text, _expect(text, pos, ","))
        first = False
        start = pos
        if text.startswith(("{", "["), start):
            end, depth = _extent(text, start)
            if depth > MAX_NESTING:
                head = text[start : min(end, start + IDENTITY_WINDOW)]
                unreadable.append(_named(head, RecursionError(f"nested {depth} deep")))
                pos = end
                continue
        try:
            item, pos = decoder.raw_decode(text, pos)
        except (RecursionError, ValueError) as exc:
            pos = _extent(text, start)[0]
            unreadable.append(_named(text[start : min(pos, start + IDENTITY_WINDOW)], exc))
            continue
        if isinstance(item, dict):
            items.append(item)
        else:
            unreadable.append(Unreadable("", "", "", f"not an object: {type(item).__name__}"))


def _extent(text: str, start: int) -> tuple[int, int]:
    """The end of the JSON value at `start` and how deep it nests, found without decoding
    it (no recursion)."""
    if not text.startswith(("{", "["), start):
        raise ValueError(f"claim list: the item at offset {start} is not an object")
    depth = deepest = 0
    for match in _TOKEN.finditer(text, start):
        token = match.group()
        if token in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif token in "]}":
            depth -= 1
        if depth == 0:
            return match.end(), deepest
        if depth < 0:
            break
    raise ValueError(f"claim list: the item at offset {start} does not end")


def _named(head: str, exc: BaseException) -> Unreadable:
    found = {key: pattern.search(head) for key, pattern in _FIELD.items()}
    uid, namespace, name = (m.group(1) if m else "" for m in found.values())
    why = (
        f"nested deeper than {MAX_NESTING} levels ({exc})"
        if isinstance(exc, RecursionError)
        else str(exc)
    )
    return Unreadable(uid, namespace, name, why)


def _skip_space(text: str, pos: int) -> int:
    match = _SPACE.match(text, pos)
    return pos if match is None else match.end()


def _expect(text: str, pos: int, char: str) -> int:
    if not text.startswith(char, pos):
        raise ValueError(f"claim list: expected {char!r} at offset {pos}")
    return pos + 1
