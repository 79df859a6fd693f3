"""`advise` fed by whoever can write a series or answer on Prometheus's port: every answer
here comes from a loopback impostor (`hostile.py`), and each must end in one `error:`
line and exit code 2, or in a plan with the bad samples named and left out; in bounded
memory (a child process's own peak RSS) and bounded time (pytest-timeout)."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest

from gpuslice.core.jsontypes import Json
from gpuslice.core.units import MIB
from tests.core.advise.advise_cases import by_model, run
from tests.core.advise.hostile import (
    STEP,
    UNTIL,
    answer,
    history,
    impostor,
    memory_points,
    run_child,
    send,
)

WINDOW = ("--until", str(UNTIL), "--since", "1h")


def advise_json(url: str, *extra: str) -> tuple[int, dict[str, object], str]:
    code, out, err = run("advise", "--prometheus", url, *WINDOW, *extra, "-o", "json")
    return code, (json.loads(out) if code == 0 else {}), err


def h100(report: dict[str, object]) -> Json:
    return by_model(json.dumps(report))["NVIDIA H100 80GB HBM3"]


def test_the_impostor_serves_a_plan() -> None:
    """The baseline the other tests bend: a well-formed answer gives a plan."""
    with impostor(history()) as prom:
        code, report, err = advise_json(prom.url)
    assert code == 0, err
    assert h100(report)["pods"][0]["peak_mib"] == 9216


# --- time -------------------------------------------------------------------------------


def drip(stop: threading.Event, what: str) -> object:
    def respond(h: BaseHTTPRequestHandler) -> None:
        if what == "headers":
            h.wfile.write(b"HTTP/1.1 200 OK\r\n")
        else:
            h.send_response(200)
            h.send_header("Content-Type", "application/json")
            h.end_headers()
            h.wfile.write(b'{"status": "success", ')
        # a byte every 0.3 s: under any per-read timeout, until advise hangs up
        while not stop.wait(0.3):
            h.wfile.write(b"X-Pad: 1\r\n" if what == "headers" else b" ")
            h.wfile.flush()

    return respond


@pytest.mark.timeout(30)
@pytest.mark.parametrize("what", ["headers", "body"])
def test_a_drip_fed_answer_ends_at_the_timeout(what: str) -> None:
    """A per-read timeout never fires on a server sending a byte now and then: the whole
    request has to end within --timeout (returning at all is the check of time)."""
    with impostor(history()) as prom:
        prom.respond = drip(prom.stop, what)  # type: ignore[assignment]
        code, _, err = advise_json(prom.url, "--timeout", "1")
    assert code == 2
    assert err.startswith("error: Prometheus at ")
    assert "no whole answer within --timeout 1 s" in err


# --- memory -----------------------------------------------------------------------------

HEAD = b'{"status":"success","data":{"resultType":"matrix","result":['


def endless(stop: threading.Event) -> object:
    """A gigabyte of series without a Content-Length, as fast as loopback takes it."""
    piece = b'{"metric":{"pod":"p"},"values":[[1,"1"]]},' * 25_000

    def respond(h: BaseHTTPRequestHandler) -> None:
        h.send_response(200)
        h.send_header("Content-Type", "application/json")
        h.end_headers()
        h.wfile.write(HEAD)
        sent = 0
        while sent < 1024**3 and not stop.is_set():
            h.wfile.write(piece)
            sent += len(piece)

    return respond


def dense(series: int, points: int) -> object:
    """One answer within the body cap that parses into millions of objects."""
    one = b'{"metric":{},"values":[' + b",".join([b'[1,"1"]'] * points) + b"]}"
    body = HEAD + b",".join([one] * series) + b"]}}"

    def respond(h: BaseHTTPRequestHandler) -> None:
        send(h, body)

    return respond


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("kind", "message"),
    [
        ("a gigabyte", "an answer over 64 MiB"),
        ("2 million series", "more than 100,000 series"),
        ("8 million points", "more than 3,000,000 samples"),
    ],
)
def test_a_huge_answer_is_refused_in_little_memory(kind: str, message: str, tmp_path: Path) -> None:
    with impostor(history()) as prom:
        if kind == "a gigabyte":
            prom.respond = endless(prom.stop)  # type: ignore[assignment]
        elif kind == "2 million series":
            prom.respond = dense(2_000_000, 1)  # type: ignore[assignment]
        else:
            prom.respond = dense(8, 1_000_000)  # type: ignore[assignment]
        child = run_child(
            "advise", "--prometheus", prom.url, *WINDOW, "--timeout", "60", tmp=tmp_path
        )
    assert child.code == 2, child.stderr
    assert child.stderr.startswith("error: Prometheus at "), child.stderr
    assert message in child.stderr
    assert child.peak_rss_mib < 200, f"{kind}: peak RSS {child.peak_rss_mib:.0f} MiB"


def test_a_sample_far_past_the_window_is_ignored() -> None:
    """One stray timestamp a year on must not stretch the pod's life (and the grid) to it."""
    with impostor(history([*memory_points(), [UNTIL + 365 * 86400, str(20 * 1024 * MIB)]])) as p:
        code, report, err = advise_json(p.url)
    assert code == 0, err
    only = h100(report)["pods"][0]
    assert only["lifetime_s"] <= 3600
    assert only["peak_mib"] == 9216


# --- redirects --------------------------------------------------------------------------


def redirect_to(location: str) -> object:
    def respond(h: BaseHTTPRequestHandler) -> None:
        h.send_response(302)
        h.send_header("Location", location)
        h.send_header("Content-Length", "0")
        h.end_headers()

    return respond


def test_a_redirect_within_the_origin_is_followed() -> None:
    good = history()

    def respond(h: BaseHTTPRequestHandler) -> None:
        if h.path.startswith("/prom/"):
            good(h)
        else:
            redirect_to("/prom" + h.path)(h)  # type: ignore[operator]

    with impostor(respond) as prom:
        code, report, err = advise_json(prom.url)
    assert code == 0, err
    assert h100(report)["pods"][0]["peak_mib"] == 9216


@pytest.mark.parametrize("elsewhere", ["another port", "ftp"])
def test_a_redirect_to_another_origin_is_refused(elsewhere: str) -> None:
    """The other origin answers well: following it would give a plan from a server the
    admin never named."""
    with impostor(history()) as other, impostor(history()) as prom:
        target = other.url if elsewhere == "another port" else "ftp://127.0.0.1/"
        prom.respond = redirect_to(target + "/api/v1/query_range")  # type: ignore[assignment]
        code, _, err = advise_json(prom.url)
        assert other.paths == []
    assert code == 2
    assert "redirected (302) to " in err
    assert f"only redirects within ('http', '127.0.0.1', {prom.url.rsplit(':', 1)[1]})" in err


# --- values -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "values",
    [
        [[UNTIL - 60, ["9663676416"]]],
        [[UNTIL - 60, {"v": 1}]],
        [["not a time", "9663676416"]],
        [[UNTIL - 60]],
        ["12"],
        [UNTIL - 60, "9663676416"],
        "9663676416",
        {"t": UNTIL},
    ],
    ids=repr,
)
def test_wrongly_typed_values_are_one_error_line(values: object) -> None:
    with impostor(history(values)) as prom:  # type: ignore[arg-type]
        code, _, err = advise_json(prom.url)
    assert code == 2, err
    assert err.startswith("error: Prometheus at "), err
    assert "gpuslice_pod_memory_used_bytes" in err
    assert err.count("\n") == 1


@pytest.mark.parametrize("labels", [None, ["pod"], {"pod": 1}, "pod"], ids=repr)
def test_wrongly_typed_labels_are_one_error_line(labels: object) -> None:
    def respond(h: BaseHTTPRequestHandler) -> None:
        send(h, answer("matrix", [{"metric": labels, "values": memory_points()}]))

    with impostor(respond) as prom:
        code, _, err = advise_json(prom.url)
    assert code == 2, err
    assert "a series without string labels" in err


@pytest.mark.parametrize(
    ("bad", "shown"),
    [
        ("NaN", "nan"),
        ("+Inf", "inf"),
        ("-Inf", "-inf"),
        ("-5", "-5.0"),
        (str(100 * 1024**3), "107374182400.0"),  # 100 GiB on an 80 GB card
    ],
)
def test_implausible_memory_is_named_and_left_out(bad: str, shown: str) -> None:
    with impostor(history([*memory_points(), [UNTIL - 5, bad]])) as prom:
        code, report, err = advise_json(prom.url)
    assert code == 0, err
    assert h100(report)["pods"][0]["peak_mib"] == 9216
    assert err.startswith("warning: ignored 1 implausible sample(s) of ")
    assert "gpuslice_pod_memory_used_bytes" in err
    assert "'pod': 'train'" in err
    assert f": {shown}, outside 0 to 81559 MiB" in err


@pytest.mark.parametrize("fb", [("+Inf", "0"), ("NaN", "NaN"), ("1e400", "1")])
def test_non_finite_gpu_memory_is_left_out(fb: tuple[str, str]) -> None:
    """An unknown model's memory is FB_USED + FB_FREE: infinite, it was a traceback."""
    with impostor(history(model="Made Up GPU", fb=fb)) as prom:
        code, _, err = advise_json(prom.url)
    assert code == 0, err
    assert "warning: ignored 1 implausible sample(s) of DCGM_FI_DEV_FB_" in err


# --- flags ------------------------------------------------------------------------------


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    ("flag", "value"),
    [
        ("--since", "inf"),
        ("--since", "nan"),
        ("--since", "1e12"),
        ("--since", "1e400s"),
        ("--step", "nan"),
        ("--step", "inf"),
        ("--step", "2d"),
        ("--until", "nan"),
        ("--until", "inf"),
        ("--until", "-1"),
        ("--until", "1e300"),
        ("--timeout", "nan"),
        ("--timeout", "inf"),
        ("--timeout", "0"),
    ],
)
def test_out_of_range_flags_are_one_error_line(flag: str, value: str) -> None:
    with impostor(history()) as prom:
        args = {"--until": str(UNTIL), "--since": "1h", flag: value}
        flat = [x for kv in args.items() for x in kv]
        code, _, err = run("advise", "--prometheus", prom.url, *flat, "-o", "json")
        assert prom.paths == []  # refused before asking
    assert code == 2, err
    assert err.startswith(f"error: {flag}: "), err
    assert value in err


@pytest.mark.timeout(60)
def test_a_range_of_too_many_steps_is_refused_after_one_request() -> None:
    with impostor(history()) as prom:
        code, _, err = run(
            "advise", "--prometheus", prom.url, "--until", str(UNTIL), "--since", "365d",
            "--step", "1s", "-o", "json",
        )  # fmt: skip
        assert len(prom.paths) == 2  # the probe (any pod memory?), then one range request
    assert code == 2, err
    assert "error: --since/--step: 31,536,001 steps of 1 s, more than the 1,000,000" in err


# --- samples files ----------------------------------------------------------------------


def samples(tmp_path: Path, *lines: str) -> Path:
    """OpenMetrics: timestamps in seconds."""
    path = tmp_path / "s.om"
    path.write_text("".join(f"{line}\n" for line in lines) + "# EOF\n")
    return path


LABELS = 'namespace="ml",pod="p",container="c",UUID="GPU-1"'


@pytest.mark.timeout(60)
def test_a_tiny_file_with_a_far_off_timestamp_makes_no_grid_to_match(tmp_path: Path) -> None:
    """Three samples; the last a thousand years on (milliseconds written as seconds):
    before, 2 billion steps were made to reach it."""
    t = int(UNTIL)
    path = samples(
        tmp_path,
        f"gpuslice_pod_memory_used_bytes{{{LABELS}}} 1024 {t}",
        f"gpuslice_pod_memory_used_bytes{{{LABELS}}} 1024 {t + 15}",
        f"gpuslice_pod_memory_used_bytes{{{LABELS}}} 1024 {t + 31_536_000_000}",
    )
    assert path.stat().st_size < 1500
    child = run_child("advise", "--samples", str(path), "--step", "15s", tmp=tmp_path)
    assert child.code == 2, child.stderr
    assert "error: the range holds more than 1,000,000 steps of 15 s" in child.stderr
    assert child.peak_rss_mib < 200


def test_a_sample_past_until_in_a_file_is_ignored(tmp_path: Path) -> None:
    t = int(UNTIL)
    path = samples(
        tmp_path,
        *(
            f"gpuslice_pod_memory_used_bytes{{{LABELS}}} {MIB} {t - (8 - i) * STEP:.0f}"
            for i in range(9)
        ),
        f"gpuslice_pod_memory_used_bytes{{{LABELS}}} {MIB} {t + 31_536_000_000}",
    )
    code, out, err = run("advise", "--samples", str(path), "--until", str(UNTIL), "-o", "json")
    assert code == 0, err
    assert json.loads(out)["models"][0]["pods"][0]["lifetime_s"] <= 9 * STEP


@pytest.mark.parametrize("value", ["NaN", "+Inf", "-1"])
def test_implausible_values_in_a_file_are_named(tmp_path: Path, value: str) -> None:
    t = int(UNTIL)
    path = samples(
        tmp_path,
        *(
            f"gpuslice_pod_memory_used_bytes{{{LABELS}}} {MIB} {t - (8 - i) * STEP:.0f}"
            for i in range(9)
        ),
        f"gpuslice_pod_memory_used_bytes{{{LABELS}}} {value} {t + 15}",
    )
    code, _, err = run("advise", "--samples", str(path), "-o", "json")
    assert code == 0, err
    assert "warning: ignored 1 implausible sample(s) of gpuslice_pod_memory_used_bytes" in err


# --- proxies ----------------------------------------------------------------------------


def test_the_environment_s_proxy_is_still_used(monkeypatch: pytest.MonkeyPatch) -> None:
    """urllib honoured HTTP_PROXY; the reader that replaced it (for its deadline and its
    redirect rule) must too. The impostor is the proxy: it is asked for the whole URL."""
    with impostor(history()) as proxy:
        for name in ("http_proxy", "HTTP_PROXY"):
            monkeypatch.setenv(name, proxy.url)
        for name in ("no_proxy", "NO_PROXY", "REQUEST_METHOD"):
            monkeypatch.delenv(name, raising=False)
        code, report, err = advise_json("http://prometheus.invalid:9090")
    assert code == 0, err
    assert h100(report)["pods"][0]["peak_mib"] == 9216
    assert proxy.paths
    assert all(p.startswith("http://prometheus.invalid:9090/api/v1/") for p in proxy.paths)


# --- the terminal -----------------------------------------------------------------------


@pytest.mark.parametrize("evil", ["[/bold] x", "[red]evil[/red]\x1b[2J\x07", "a\u2028b"])
def test_labels_are_shown_not_acted_on_in_the_table(evil: str) -> None:
    """A model or pod name holding rich markup was a traceback (`[/bold]`) or restyled the
    table; a control character went to the terminal as it was."""
    with impostor(history(model=evil, pod_name=evil)) as prom:
        code, out, err = run("advise", "--prometheus", prom.url, *WINDOW)
    assert code == 0, err
    shown = "".join(c if c.isprintable() else repr(c)[1:-1] for c in evil)
    assert out.count(shown) >= 2  # the model's line and the pod's row
    assert "\x1b" not in out
    assert "\x07" not in out


@pytest.mark.parametrize(
    "body",
    [b"[" * 200_000, b'{"a":' * 200_000, b"\xff\xfe", b"null", b'"x"'],
    ids=["nested arrays", "nested objects", "not UTF-8", "null", "a string"],
)
def test_an_answer_that_is_not_json_of_the_api_is_one_error_line(body: bytes) -> None:
    """Nested past Python's stack, json raises RecursionError, not ValueError."""
    with impostor(lambda h: send(h, body)) as prom:
        code, _, err = advise_json(prom.url)
    assert code == 2, err
    assert err.startswith("error: Prometheus at ")
    assert err.count("\n") == 1


@pytest.mark.parametrize(
    ("cap", "message"),
    [("MAX_SERIES", "more than 5 series"), ("MAX_SAMPLES", "more than 5 samples")],
)
def test_a_samples_file_is_held_to_the_series_and_sample_caps(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cap: str, message: str
) -> None:
    """The caps an answer from Prometheus is held to, made small here: a file under its
    256 MiB cap can still hold tens of millions of samples."""
    from gpuslice.prometheus import samples as samples_module

    monkeypatch.setattr(samples_module, cap, 5)
    t = int(UNTIL)
    path = samples(
        tmp_path,
        *(
            f'gpuslice_pod_memory_used_bytes{{pod="p{i}",UUID="GPU-1"}} {MIB} {t + i}'
            for i in range(6)
        )
        if cap == "MAX_SERIES"
        else (f"gpuslice_pod_memory_used_bytes{{{LABELS}}} {MIB} {t + i}" for i in range(6)),
    )
    code, _, err = run("advise", "--samples", str(path))
    assert code == 2, err
    assert err.startswith(f"error: {path}: {message} (the most advise reads)")
