"""One formatter for every log record: ours (both call styles) and gRPC's Python loggers.

structlog's `ProcessorFormatter` on the root handler renders each stdlib record, in text
(`ts=... level=... logger=... event=... key=value`, logfmt) or as one JSON object per line
with real fields (`--log-format json`, the chart's `logFormat: json`):

- structlog calls (`gpuslice.logs.get_logger`) carry their typed fields on the record;
- older `log.info("event=x key=%s", v)` calls are split back into fields, so they render as
  fields in JSON too (the rest of the line, if any, goes to `message`);
- anything else (gRPC's `grpc._server`, `grpc.aio` loggers, third-party libraries) becomes
  `event=<its message>`.

Every field value is bounded (`core.text.log_value`, 512 characters; a traceback 4096) and,
in text, has its control characters escaped, here rather than at each call: values come from
claims' opaque configs, API errors and clients, and one raw CR or ANSI escape in a 5 KB value
rewrites what an operator's terminal shows. JSON escapes control characters itself.

gRPC's C core writes its own lines straight to stderr, bypassing Python logging; they are
limited to errors (`GRPC_VERBOSITY=ERROR`, set here unless the environment says otherwise,
read when gRPC starts) and stay plain text.
"""

from __future__ import annotations

import logging
import os
import re
import sys
from collections.abc import Mapping, MutableMapping
from typing import Any

import structlog

from gpuslice.core.text import MAX_LOG_VALUE_CHARS, log_value
from gpuslice.logs import STRUCTURED_ATTR

_PAIR = re.compile(r"""([A-Za-z_][\w.-]*)=("(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|[^\s'"]\S*|)""")


def _unquote(value: str) -> str:
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
        return value[1:-1].replace("\\" + value[0], value[0])
    return value


def split_legacy(message: str) -> dict[str, str] | None:
    """`event=x a=1 b='two words': tail` -> {"event": "x", "a": "1", "b": "two words",
    "message": "tail"}; None when the message does not start with `event=`."""
    if not message.startswith("event="):
        return None
    fields: dict[str, str] = {}
    pos = 0
    while True:
        while pos < len(message) and message[pos] == " ":
            pos += 1
        match = _PAIR.match(message, pos)
        if match is None:
            break
        value = match.group(2)
        if value.endswith(":") and not value.startswith(("'", '"')):
            value = value[:-1]  # `key=v: free text`
        fields[match.group(1)] = _unquote(value)
        pos = match.end()
    rest = message[pos:].lstrip(": ").strip()
    if rest:
        fields["message"] = rest
    return fields


def _fields_from_record(
    _logger: Any, _method: str, event_dict: MutableMapping[str, Any]
) -> MutableMapping[str, Any]:
    record = event_dict.get("_record")
    structured = getattr(record, STRUCTURED_ATTR, None)
    if isinstance(structured, dict):
        event_dict.update(structured)
        return event_dict
    legacy = split_legacy(str(event_dict.get("event", "")))
    if legacy is not None:
        event_dict.update(legacy)
    return event_dict


MAX_TRACE_CHARS = 4096
"""A traceback (`exception`) or a stack (`stack`: the watchdog's blocked loop) keeps more
than other values: its frames, the innermost last, are what the report is for, and it only
comes with a crash or a stuck loop."""
TRACE_KEYS = frozenset({"exception", "stack"})
MAX_ITEMS = 64
"""Entries of a list or mapping kept in a JSON log value; the rest are counted."""


def _limit(key: str) -> int:
    return MAX_TRACE_CHARS if key in TRACE_KEYS else MAX_LOG_VALUE_CHARS


def _text_values(
    _logger: Any, _method: str, event_dict: MutableMapping[str, Any]
) -> MutableMapping[str, Any]:
    """Each value as the logfmt renderer will print it (`str()`), escaped and bounded; a
    newline is left for the renderer, which writes it as `\\n` itself. Booleans and None
    stay as they are: the renderer prints them its own way."""
    for key, value in event_dict.items():
        if value is None or isinstance(value, bool | int | float):
            continue
        event_dict[key] = log_value(str(value), _limit(key), keep="\n")
    return event_dict


def _bounded(value: Any, limit: int) -> Any:
    if isinstance(value, str):
        return log_value(value, limit, escape=False)  # JSON escapes the characters itself
    if isinstance(value, Mapping):
        items = list(value.items())
        out = {str(k): _bounded(v, limit) for k, v in items[:MAX_ITEMS]}
        if len(items) > MAX_ITEMS:
            out["..."] = f"{len(items) - MAX_ITEMS} more"
        return out
    if isinstance(value, list | tuple | set | frozenset):
        seq = list(value)
        kept = [_bounded(v, limit) for v in seq[:MAX_ITEMS]]
        if len(seq) > MAX_ITEMS:
            kept.append(f"...({len(seq) - MAX_ITEMS} more)")
        return kept
    if value is None or isinstance(value, bool | int | float):
        return value
    return _bounded(str(value), limit)  # what the renderer's `default=str` would write


def _json_values(
    _logger: Any, _method: str, event_dict: MutableMapping[str, Any]
) -> MutableMapping[str, Any]:
    """Each value bounded, nested ones too; the JSON encoder escapes control characters."""
    for key, value in event_dict.items():
        event_dict[key] = _bounded(value, _limit(key))
    return event_dict


def formatter(fmt: str) -> structlog.stdlib.ProcessorFormatter:
    renderer: Any
    bound: Any = _text_values
    if fmt == "json":
        renderer = structlog.processors.JSONRenderer(default=str)
        bound = _json_values
    else:
        renderer = structlog.processors.LogfmtRenderer(
            key_order=["ts", "level", "logger", "event"], drop_missing=True
        )
    return structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=[
            _fields_from_record,
            structlog.stdlib.add_log_level,
            structlog.stdlib.add_logger_name,
            structlog.processors.TimeStamper(fmt="iso", utc=True, key="ts"),
        ],
        processors=[
            structlog.stdlib.ProcessorFormatter.remove_processors_meta,
            structlog.processors.format_exc_info,
            bound,
            renderer,
        ],
    )


CHATTY_LIBRARIES = ("httpx", "httpx2", "httpcore", "hpack", "h11")
"""Libraries that log each request at INFO (httpx, and httpx2 which lightkube uses: `HTTP
Request: GET ... "200 OK"`, one line per watch and patch the agent makes): their INFO is our
DEBUG, seen only with -v."""


def _demoted(record: logging.LogRecord) -> bool:
    """A library's INFO record as DEBUG, dropped unless the root logs debug."""
    if record.levelno == logging.INFO:
        record.levelno, record.levelname = logging.DEBUG, "DEBUG"
    return logging.getLogger().isEnabledFor(record.levelno)


def setup_logging(fmt: str = "text", *, verbose: bool = False) -> None:
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(formatter(fmt))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.DEBUG if verbose else logging.INFO)
    logging.getLogger("grpc").setLevel(logging.WARNING)
    for name in CHATTY_LIBRARIES:
        library = logging.getLogger(name)
        if _demoted not in library.filters:
            library.addFilter(_demoted)
