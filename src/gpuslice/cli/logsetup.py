"""One formatter for every log record: ours (both call styles) and gRPC's Python loggers.

structlog's `ProcessorFormatter` on the root handler renders each stdlib record, in text
(`ts=... level=... logger=... event=... key=value`, logfmt) or as one JSON object per line
with real fields (`--log-format json`, the chart's `logFormat: json`):

- structlog calls (`gpuslice.logs.get_logger`) carry their typed fields on the record;
- older `log.info("event=x key=%s", v)` calls are split back into fields, so they render as
  fields in JSON too (the rest of the line, if any, goes to `message`);
- anything else (gRPC's `grpc._server`, `grpc.aio` loggers, third-party libraries) becomes
  `event=<its message>`.

gRPC's C core writes its own lines straight to stderr, bypassing Python logging; they are
limited to errors (`GRPC_VERBOSITY=ERROR`, set here unless the environment says otherwise,
read when gRPC starts) and stay plain text.
"""

from __future__ import annotations

import logging
import os
import re
import sys
from collections.abc import MutableMapping
from typing import Any

import structlog

from gpuslice.logs import STRUCTURED_ATTR

_PAIR = re.compile(r"""([A-Za-z_][\w.-]*)=("(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|[^\s'"]\S*|)""")


def _unquote(value: str) -> str:
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
        return value[1:-1].replace("\\" + value[0], value[0])
    return value


def split_legacy(message: str) -> dict[str, Any] | None:
    """`event=x a=1 b='two words': tail` -> {"event": "x", "a": "1", "b": "two words",
    "message": "tail"}; None when the message does not start with `event=`."""
    if not message.startswith("event="):
        return None
    fields: dict[str, Any] = {}
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


def formatter(fmt: str) -> structlog.stdlib.ProcessorFormatter:
    renderer: Any
    if fmt == "json":
        renderer = structlog.processors.JSONRenderer(default=str)
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
            renderer,
        ],
    )


def setup_logging(fmt: str = "text", *, verbose: bool = False) -> None:
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(formatter(fmt))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.DEBUG if verbose else logging.INFO)
    logging.getLogger("grpc").setLevel(logging.WARNING)
