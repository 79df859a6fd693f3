"""The one structured logging call style: `log = get_logger(__name__)`, then
`log.info("plan", config=name, resources=counts)`.

structlog (the ecosystem's choice) gives the call style and typed fields; records still go
through stdlib `logging` (structlog's stdlib bridge), so pytest's `caplog`, the root
handler set up by `cli.logsetup`, and third-party loggers (gRPC's) all see one stream. The
record's message is the same `event=<name> key=value` line the older `logging` calls write,
so text logs and `caplog` assertions look alike for both call styles; the typed fields ride
on the record (`record.structured`) for the JSON renderer.

Configured on import (idempotent): a module that logs this way imports this one.
"""

from __future__ import annotations

import json
from collections.abc import MutableMapping
from typing import Any

import structlog

from gpuslice.core.text import has_control, log_value

STRUCTURED_ATTR = "structured"
"""LogRecord attribute holding the typed fields of a structlog call."""


def logfmt_value(value: object) -> str:
    """One value of the record's `event=... key=value` message (what `caplog` and any other
    handler read): bounded, and quoted as JSON, which escapes control characters, whenever
    it holds one or would split the line into other fields."""
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    text = log_value(text, escape=False)
    if text and not any(c in text for c in ' "=') and not has_control(text):
        return text
    return json.dumps(text)


def _to_stdlib(
    _logger: Any, _method: str, event_dict: MutableMapping[str, Any]
) -> tuple[tuple[Any, ...], dict[str, object]]:
    fields = dict(event_dict)
    event = str(fields.pop("event", ""))
    exc_info = fields.pop("exc_info", None)
    line = " ".join([f"event={event}", *(f"{k}={logfmt_value(v)}" for k, v in fields.items())])
    kwargs: dict[str, object] = {"extra": {STRUCTURED_ATTR: {"event": event, **fields}}}
    if exc_info:
        kwargs["exc_info"] = exc_info
    return (line,), kwargs


def _configure() -> None:
    if structlog.is_configured():
        return
    structlog.configure(
        processors=[
            structlog.stdlib.filter_by_level,
            structlog.contextvars.merge_contextvars,
            _to_stdlib,
        ],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=True,
    )


def get_logger(name: str) -> structlog.stdlib.BoundLogger:
    _configure()
    logger: structlog.stdlib.BoundLogger = structlog.stdlib.get_logger(name)
    return logger


__all__ = ["STRUCTURED_ATTR", "get_logger", "logfmt_value"]
