"""Logs: real JSON fields for both call styles and for gRPC's Python loggers; readable text."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator

import pytest

from gpuslice.cli.logsetup import formatter, split_legacy
from gpuslice.logs import get_logger


@pytest.fixture
def json_lines() -> Iterator[io.StringIO]:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(formatter("json"))
    root = logging.getLogger()
    old_level = root.level
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    try:
        yield stream
    finally:
        root.removeHandler(handler)
        root.setLevel(old_level)


def records(stream: io.StringIO) -> list[dict[str, object]]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def test_structured_calls_are_json_fields_with_their_types(json_lines: io.StringIO) -> None:
    get_logger("gpuslice.test").info("plan", config="a100", resources={"nvidia.com/gpu": 8})
    [doc] = records(json_lines)
    assert doc["event"] == "plan"
    assert doc["config"] == "a100"
    assert doc["resources"] == {"nvidia.com/gpu": 8}
    assert (doc["level"], doc["logger"]) == ("info", "gpuslice.test")
    assert "msg" not in doc, "no key=value string inside the JSON"


def test_old_style_calls_are_split_into_fields(json_lines: io.StringIO) -> None:
    logging.getLogger("gpuslice.test").warning(
        "event=node-label-unknown label=%s waited_s=%s: planning without it", "a/b", 10.0
    )
    logging.getLogger("gpuslice.test").warning("event=plan-warning message=%r", "it's 'x'")
    first, second = records(json_lines)
    assert first["event"] == "node-label-unknown"
    assert first["label"] == "a/b"
    assert first["waited_s"] == "10.0"
    assert first["message"] == "planning without it"
    assert second["event"] == "plan-warning"
    assert second["message"] == "it's 'x'"


def test_grpc_python_loggers_go_through_the_same_formatter(json_lines: io.StringIO) -> None:
    logging.getLogger("grpc._server").error("Exception calling application: boom")
    [doc] = records(json_lines)
    assert doc["logger"] == "grpc._server"
    assert doc["event"] == "Exception calling application: boom"


def test_exceptions_are_one_field(json_lines: io.StringIO) -> None:
    try:
        raise ValueError("bad")
    except ValueError:
        get_logger("gpuslice.test").exception("failed", step=3)
    [doc] = records(json_lines)
    assert doc["step"] == 3
    assert "ValueError: bad" in str(doc["exception"])


def test_text_mode_reads_like_the_old_lines() -> None:
    record = logging.LogRecord(
        "gpuslice.x", logging.INFO, __file__, 1, "event=a b=%s", ("c",), None
    )
    line = formatter("text").format(record)
    assert " level=info logger=gpuslice.x event=a b=c" in line
    assert line.startswith("ts=")


def test_caplog_sees_structured_calls_as_event_lines(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="gpuslice.test")
    get_logger("gpuslice.test").info("registered", resource="nvidia.com/gpu", note="two words")
    assert 'event=registered resource=nvidia.com/gpu note="two words"' in caplog.text


def test_a_message_not_in_event_style_is_left_alone() -> None:
    assert split_legacy("plain words") is None
    assert split_legacy("event=x") == {"event": "x"}


def test_every_text_value_is_escaped_and_bounded_whatever_its_source() -> None:
    """Control characters from a structlog field, an old-style call's argument and a
    foreign logger's message all come out as escapes, and no value grows past the bound
    however many characters need escaping (each escape counts as what it prints)."""
    text = formatter("text")
    structured = logging.LogRecord("gpuslice.x", logging.INFO, __file__, 1, "", (), None)
    structured.structured = {"event": "e", "v": "a\rb\x1bc\u2028d\x85e\u202ef"}
    legacy = logging.LogRecord(
        "gpuslice.x", logging.INFO, __file__, 1, "event=e v=%s", ("\x1b[2J",), None
    )
    foreign = logging.LogRecord(
        "grpc._server", logging.ERROR, __file__, 1, "x\r\x00" * 900, (), None
    )
    lines = [text.format(r) for r in (structured, legacy, foreign)]
    assert "v=a\\rb\\x1bc\\u2028d\\x85e\\u202ef" in lines[0]
    assert "v=\\x1b[2J" in lines[1]
    for line in lines:
        assert line.isprintable(), line
        assert len(line) < 700, len(line)
    assert lines[2].endswith("...(2700_chars)")


def test_json_values_stay_json_and_are_bounded(json_lines: io.StringIO) -> None:
    big = "\r\x1b" + "x" * 5000
    get_logger("gpuslice.test").info("e", v=big, nested={"k": big}, items=list(range(100)))
    [doc] = records(json_lines)
    assert doc["v"] == big[:512] + "...(5002_chars)"
    assert doc["nested"] == {"k": big[:512] + "...(5002_chars)"}
    assert doc["items"] == [*range(64), "...(36 more)"]
