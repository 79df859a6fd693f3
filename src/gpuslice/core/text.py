"""Showing text that came from a client (device IDs, resource names) in errors and logs.

A gRPC client can send any string: a 1 MB device ID echoed whole in an error overflows
gRPC's metadata limit and floods the log, and a newline, `,`, `=` or space written raw
into the `event=name key=value` log forges or splits fields. Everything a client sent goes
through `shown` (one value) or `shown_all` (a list) before it reaches a message.
"""

from __future__ import annotations

import re
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


MAX_LOG_VALUE_CHARS = 512
"""Characters of one log field value kept: a claim's opaque config or an API error can be
kilobytes, and a log line that size buries its neighbours and trips log shippers' limits."""

_UNSAFE = re.compile(
    "[\x00-\x1f\x7f-\x9f\xad\u0600-\u0605\u061c\u06dd\u070f\u0890\u0891\u08e2\u180e"
    "\u200b-\u200f\u2028-\u202e\u2060-\u2064\u2066-\u206f\ud800-\udfff\ufeff\ufff9-\ufffb"
    "\U000110bd\U000110cd\U00013430-\U00013438\U0001bca0-\U0001bca3\U0001d173-\U0001d17a"
    "\U000e0001\U000e0020-\U000e007f]"
)
"""Unicode's control (Cc), format (Cf), line and paragraph separator (Zl, Zp) and surrogate
(Cs) characters: a CR rewrites the line a terminal shows, ANSI escapes (ESC) clear or recolour
it, U+2028 and U+0085 start a new line in some viewers, bidi overrides reorder it. None has a
place in a log value, so each is shown as an escape instead."""


def has_control(value: str) -> bool:
    """Whether `value` holds a character `log_value` escapes."""
    return _UNSAFE.search(value) is not None


_SHORT = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def log_value(
    value: str, limit: int = MAX_LOG_VALUE_CHARS, *, escape: bool = True, keep: str = ""
) -> str:
    """`value` fit for one field of a log line: every control or format character escaped
    (`\\r`, `\\x1b`, `\\u2028`), except those in `keep` (a renderer that escapes them itself),
    and at most `limit` characters of escaped text, with `...(N_chars)` saying how long the
    original was. Unlike `shown`, ordinary text (spaces, punctuation, letters) is kept as is:
    log values are messages and paths, not IDs. `escape=False` only bounds (for an encoder
    that escapes on its own, as JSON does)."""
    head = value[: limit + 1]
    if not escape or _UNSAFE.search(head) is None:
        if len(value) <= limit:
            return value
        return f"{value[:limit]}...({len(value)}_chars)"
    out: list[str] = []
    size = 0
    for char in head:
        if char in keep or _UNSAFE.match(char) is None:
            piece = char
        else:
            piece = _SHORT.get(char) or _escape(char)
        size += len(piece)
        if size > limit:  # always reached when `value` is longer than `limit`
            return "".join(out) + f"...({len(value)}_chars)"
        out.append(piece)
    return "".join(out)
