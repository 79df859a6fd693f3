"""Showing text that came from a client (device IDs, resource names) in errors and logs.

A gRPC client can send any string: a 1 MB device ID echoed whole in an error overflows
gRPC's metadata limit and floods the log, and a newline, `,`, `=` or space written raw
into the `event=name key=value` log forges or splits fields. Everything a client sent goes
through `shown` (one value) or `shown_all` (a list) before it reaches a message.
"""

from __future__ import annotations

import string
from collections.abc import Iterable

MAX_SHOWN_CHARS = 80
"""Characters of one client value kept in a message; the rest is counted, not shown."""
MAX_SHOWN_ITEMS = 8
"""Values of a list kept in a message; the rest is counted, not shown."""

_PLAIN = frozenset(string.ascii_letters + string.digits + "-_.:/@+")
"""Characters that pass unchanged: all that device IDs and resource names are made of."""


def _escape(char: str) -> str:
    code = ord(char)
    return (
        f"\\x{code:02x}"
        if code < 0x100
        else f"\\u{code:04x}"
        if code < 0x10000
        else f"\\U{code:08x}"
    )


def shown(value: str, limit: int = MAX_SHOWN_CHARS) -> str:
    """`value` safe for a message: at most `limit` characters of it, anything unusual escaped.

    Valid IDs come back unchanged; others come back as one token with no space, comma,
    equals sign or control character, and a note of how much was cut.
    """
    head = value[:limit]
    out = "".join(c if c in _PLAIN else _escape(c) for c in head)
    if len(value) > limit:
        out += f"...(+{len(value) - limit}_chars)"
    return out or '""'


def shown_all(values: Iterable[str], limit: int = MAX_SHOWN_ITEMS) -> str:
    """Up to `limit` distinct values, each `shown`, joined by `, `, and how many were left out."""
    distinct = list(dict.fromkeys(values))
    out = ", ".join(shown(v) for v in distinct[:limit])
    if len(distinct) > limit:
        out += f" and {len(distinct) - limit} more"
    return out
