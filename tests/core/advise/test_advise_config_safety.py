"""`--write-config` writes a file an admin is told to `kubectl apply`; the GPU model name
in it comes from a `modelName` label anyone who can write a series controls. Whatever the
label holds, the file must be one ConfigMap and nothing else."""

from __future__ import annotations

import json
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from gpuslice.cli.advise import config_map_text
from gpuslice.core.advise import RawSeries, advise, build_history
from gpuslice.core.units import MIB
from tests.core.advise.advise_cases import run
from tests.core.advise.hostile import UNTIL, history, impostor

ESCALATION = (
    "Evil GPU\n---\napiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRoleBinding\n"
    "metadata: {name: pwned}\nroleRef: {apiGroup: rbac.authorization.k8s.io, "
    "kind: ClusterRole, name: cluster-admin}\nsubjects: [{kind: ServiceAccount, "
    "name: default, namespace: default}]\n"
)
"""The report's payload: a label that used to add a cluster-admin binding to the file."""


def series(model: str) -> list[RawSeries]:
    gpu = {"UUID": "GPU-1", "modelName": model}
    labels = {"namespace": "ml", "pod": "p", "container": "c", "UUID": "GPU-1"}
    return [
        RawSeries("DCGM_FI_DEV_FB_USED", gpu, [(UNTIL, 1000.0)]),
        RawSeries("DCGM_FI_DEV_FB_FREE", gpu, [(UNTIL, 79000.0)]),
        RawSeries(
            "gpuslice_pod_memory_used_bytes",
            labels,
            [(UNTIL - 15.0 * i, 9000.0 * MIB) for i in range(10)],
        ),
    ]


def only_a_config_map(text: str) -> dict[str, object]:
    docs = [d for d in yaml.safe_load_all(text) if d is not None]
    assert len(docs) == 1, docs
    doc = docs[0]
    assert isinstance(doc, dict)
    assert set(doc) == {"apiVersion", "kind", "metadata", "data"}
    assert (doc["apiVersion"], doc["kind"]) == ("v1", "ConfigMap")
    assert doc["metadata"] == {"name": "gpuslice-advise"}
    return doc


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.text()
    | st.lists(
        st.sampled_from(
            ["\n", "\r", "---", "...", "\u2028", "\u2029", "\x85", "\x00", "\x1b", "#", ":", "'"]
        )
        | st.sampled_from(
            ['"', "\\", "kind: Secret", "- a", "{", "}", "\t", "\ufeff", "&a", "*a", "!!"]
        )
        | st.text(max_size=3)
    ).map("".join)
)
@example(ESCALATION)
@example("x\r...\r---\rkind: Secret")
@example("x\u2028---\u2028kind: Secret")
@example("x\x85---\x85kind: Secret")
def test_any_model_name_writes_exactly_one_config_map(model: str) -> None:
    plan = advise(build_history(series(model), 15.0), with_replay=False)
    doc = only_a_config_map(config_map_text(plan))
    data = doc["data"]
    assert isinstance(data, dict)
    assert len(data) == 1
    name = next(iter(data))
    # a ConfigMap key and a node label value: Kubernetes takes [-._a-zA-Z0-9] only
    assert name.isascii(), name
    assert all(c.isalnum() or c == "-" for c in name), name
    assert yaml.safe_load(data[name])["sharing"]["timeSlicing"]["resources"][0]["replicas"] > 0


def test_the_escalation_label_from_a_samples_file(tmp_path: Path) -> None:
    label = json.dumps(ESCALATION)[1:-1]  # OpenMetrics escapes a label as JSON does here
    t = int(UNTIL)
    lines = [
        f'DCGM_FI_DEV_FB_USED{{UUID="GPU-1",modelName="{label}"}} 1000 {t}',
        f'DCGM_FI_DEV_FB_FREE{{UUID="GPU-1",modelName="{label}"}} 79000 {t}',
        *(
            f'gpuslice_pod_memory_used_bytes{{namespace="ml",pod="p",container="c",UUID="GPU-1"}}'
            f" {9000 * MIB} {t - (9 - i) * 15}"
            for i in range(10)
        ),
        "# EOF",
    ]
    samples = tmp_path / "evil.om"
    samples.write_text("\n".join(lines) + "\n")
    config = tmp_path / "advised.yaml"
    code, _, err = run("advise", "--samples", str(samples), "--write-config", str(config))
    assert code == 0, err
    only_a_config_map(config.read_text())
    assert "ClusterRoleBinding" in config.read_text()  # shown, quoted, in the comment


def test_the_escalation_label_from_prometheus(tmp_path: Path) -> None:
    config = tmp_path / "advised.yaml"
    respond = history(model=ESCALATION)

    def serve(h: BaseHTTPRequestHandler) -> None:
        respond(h)

    with impostor(serve) as prom:
        code, _, err = run(
            "advise", "--prometheus", prom.url, "--until", str(UNTIL), "--since", "1h",
            "--write-config", str(config),
        )  # fmt: skip
    assert code == 0, err
    only_a_config_map(config.read_text())
