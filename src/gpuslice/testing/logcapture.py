"""The structured events a block logged, for tests, whatever ran before it in the process.

`structlog.testing.capture_logs` swaps structlog's processors, which a logger cached on its
first use (`gpuslice.logs` caches them) never sees again: a test that captured fine alone
saw nothing once another test in the same process (a pytest-xdist worker runs many) had
logged through that module first. This reads what every call already carries on the stdlib
record (`gpuslice.logs.STRUCTURED_ATTR`), with the root logger opened to every level for the
block's length, so the capture no longer depends on which tests ran before.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager

from gpuslice.core.jsontypes import Json
from gpuslice.logs import STRUCTURED_ATTR


class _Events(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.events: list[Json] = []

    def emit(self, record: logging.LogRecord) -> None:
        fields = getattr(record, STRUCTURED_ATTR, None)
        if isinstance(fields, dict):
            self.events.append({**fields, "log_level": record.levelname.lower()})


@contextmanager
def captured_events() -> Iterator[list[Json]]:
    """The events logged inside the block, oldest first: each its `event` name, its fields
    and its `log_level`, as `structlog.testing.capture_logs` gives them."""
    root = logging.getLogger()
    handler = _Events()
    level = root.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    try:
        yield handler.events
    finally:
        root.setLevel(level)
        root.removeHandler(handler)
