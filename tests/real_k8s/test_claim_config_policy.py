"""The chart's claim-config admission policy on a real kube-apiserver, held to the corpus
Prepare is held to (tests/configs/claims/opaque-configs.yaml): every config gets the same
verdict from the API server with the policy as from Prepare, on ResourceClaims and on
ResourceClaimTemplates, and a refusal names the policy (not the API server's own checks).
The server runs the policy's CEL under its real cost limits."""

from __future__ import annotations

import json
import re
import shutil
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuslice.core.jsontypes import Json
from gpuslice.testing import envtest

DRIVER = "gpu.nvidia.com"
NAMESPACE = "claim-configs"
GPU_CONFIG = '{"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig"}'


def _policy_manifests(**dra: Any) -> list[Json]:
    from tests.chart.chart_support import (
        render,  # the chart tests' Helm rendering (skips without Helm)
    )

    result = render(dra={"enabled": True, **dra})
    assert result.ok, result.problems
    return [
        m for m in result.manifests
        if m["kind"].startswith("ValidatingAdmissionPolicy")
        and m["metadata"]["name"].endswith("-claim-configs")
    ]  # fmt: skip


def _generated_policy(kinds: Sequence[Any]) -> list[Json]:
    """The policy and binding of a copy of the chart whose template is generated for `kinds`
    (`scripts/gen-claim-policy` writes the registry's into the chart itself)."""
    from gpuslice.core.dra.opaque.admission import TEMPLATE, policy_template
    from tests.chart.chart_support import SETS, check_chart

    with tempfile.TemporaryDirectory() as tmp:
        chart = Path(tmp) / "gpuslice"
        shutil.copytree(check_chart.CHART, chart)
        (chart / "templates" / Path(TEMPLATE).name).write_text(policy_template(kinds))
        values = check_chart.deep_merge(SETS["default"], {"dra": {"enabled": True}})
        result = check_chart.check_values("default", values, chart)
    assert result.ok, result.problems
    return [
        m for m in result.manifests
        if m["kind"].startswith("ValidatingAdmissionPolicy")
        and m["metadata"]["name"].endswith("-claim-configs")
    ]  # fmt: skip


def _install(plane: envtest.ControlPlane, manifests: list[Json], probe: str,
             refused: bool) -> None:  # fmt: skip
    """Apply (replacing a policy of the same name) and wait until the API server, which
    loads a policy asynchronously, gives the probe document the verdict wanted."""
    applied = plane.kubectl("apply", "--validate=false", "-f", "-",
                            stdin=yaml.safe_dump_all(manifests))  # fmt: skip
    assert applied.returncode == 0, applied.stderr
    deadline = time.monotonic() + 30
    while (plane.kubectl("create", "--validate=false", "--dry-run=server", "-f", "-",
                         stdin=probe).returncode != 0) is not refused:  # fmt: skip
        assert time.monotonic() < deadline, "the claim-config policy never changed"
        time.sleep(0.2)


def _spec(raws: list[str], driver: str = DRIVER) -> Json:
    return {"devices": {
        "requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}],
        "config": [{"opaque": {"driver": driver, "parameters": f"@@{i}@@"}}
                   for i, _ in enumerate(raws)],
    }}  # fmt: skip


def _document(kind: str, name: str, raws: list[str], driver: str = DRIVER) -> str:
    """One object as JSON text, each config's parameters spliced in as written (so `50.0`
    reaches the server as `50.0`)."""
    spec = _spec(raws, driver)
    obj = {"apiVersion": "resource.k8s.io/v1", "kind": kind,
           "metadata": {"name": name, "namespace": NAMESPACE},
           "spec": spec if kind == "ResourceClaim" else {"spec": spec}}  # fmt: skip
    text = json.dumps(obj)
    for i, raw in enumerate(raws):
        text = text.replace(f'"@@{i}@@"', raw)
    return text


def _verdicts(plane: envtest.ControlPlane, kind: str, docs: dict[str, str]) -> dict[str, str]:
    """Server-side dry runs of every document in one kubectl call: name -> '' when created,
    else the server's refusal."""
    done = plane.kubectl(
        "create", "--validate=false", "--dry-run=server", "-o", "name", "-f", "-",
        stdin="\n".join(docs.values()),
    )  # fmt: skip
    created = set(re.findall(r"/(\S+)", done.stdout))
    refused: dict[str, str] = {}
    for line in done.stderr.splitlines():
        m = re.search(r'"(c-\d+)"', line)
        if m:
            refused[m.group(1)] = line
    assert set(docs) == created | set(refused), (kind, done.stdout, done.stderr)
    return {name: refused.get(name, "") for name in docs}


@pytest.fixture(scope="module")
def policy(control_plane: envtest.ControlPlane) -> envtest.ControlPlane:
    manifests = _policy_manifests()
    assert len(manifests) == 2, "the policy and its binding"
    control_plane.kubectl("create", "namespace", NAMESPACE)
    # the API server loads a new policy asynchronously: wait until it refuses
    bad = _document("ResourceClaim", "probe", ['{"kind": "Nope"}'])
    _install(control_plane, manifests, bad, refused=True)
    return control_plane


@pytest.mark.parametrize("kind", ["ResourceClaim", "ResourceClaimTemplate"])
def test_the_api_server_with_the_policy_agrees_with_prepare(
    policy: envtest.ControlPlane, kind: str
) -> None:
    from tests.core.dra.opaque_corpus import corpus, prepare_verdict

    entries = corpus()
    docs = {f"c-{i}": _document(kind, f"c-{i}", [e["parameters"]]) for i, e in enumerate(entries)}
    got = _verdicts(policy, kind, docs)
    disagree = []
    for i, entry in enumerate(entries):
        refusal = got[f"c-{i}"]
        server = "refuse" if refusal else "accept"
        if not server == prepare_verdict(entry["parameters"]) == entry["verdict"]:
            disagree.append((entry["parameters"], entry["verdict"], server, refusal))
        if refusal:
            assert "-claim-configs' with binding" in refusal, refusal
            assert "spec.devices.config[].opaque.parameters" in refusal, refusal
    assert not disagree, "\n".join(map(str, disagree))


def test_a_refusal_names_the_field_and_the_value(policy: envtest.ControlPlane) -> None:
    docs = {
        "c-0": _document("ResourceClaim", "c-0", ['{"apiVersion": "resource.nvidia.com/v1beta1", '
                                                   '"kind": "GPUConfig"}']),
        "c-1": _document("ResourceClaim", "c-1", [
            '{"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig", "shraing": {}}']),
    }  # fmt: skip
    mps = '{"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig", "sharing": '
    docs["c-2"] = _document("ResourceClaim", "c-2", [mps + '{"strategy": "Mps"}}'])
    percentage = '{"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 150}}}'
    docs["c-3"] = _document("ResourceClaim", "c-3", [mps + percentage])
    got = _verdicts(policy, "ResourceClaim", docs)
    assert "resource.nvidia.com/v1beta1 GPUConfig" in got["c-0"]
    assert "unknown field(s) GpuConfig: shraing" in got["c-1"]
    assert "spec.devices.config[].opaque.parameters.sharing.strategy: " in got["c-2"]
    assert got["c-2"].endswith("; got Mps"), got["c-2"]
    assert got["c-3"].endswith("from 0 to 100; got 150"), got["c-3"]
    template = {"c-4": _document("ResourceClaimTemplate", "c-4", [mps + '{"strategy": 1}}'])}
    refused = _verdicts(policy, "ResourceClaimTemplate", template)["c-4"]
    assert "spec.spec.devices.config[].opaque.parameters.sharing.strategy: " in refused
    assert refused.endswith("; got 1"), refused


def test_other_drivers_and_claims_without_configs_are_not_its_business(
    policy: envtest.ControlPlane,
) -> None:
    """Another driver's configs are opaque to gpuslice, as Prepare skips them unread; a claim
    with no config, or no devices, passes; a good config beside a bad one is still refused."""
    bad = '{"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig", "sharing": {}}'
    meta = {"name": "c-2", "namespace": NAMESPACE}
    no_devices = json.dumps(
        {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": meta, "spec": {}}
    )
    docs = {
        "c-0": _document("ResourceClaim", "c-0", [bad], driver="other.example.com"),
        "c-1": _document("ResourceClaim", "c-1", []),
        "c-2": no_devices,
        "c-3": _document("ResourceClaim", "c-3", [GPU_CONFIG, bad]),
    }
    got = _verdicts(policy, "ResourceClaim", docs)
    assert got["c-0"] == got["c-1"] == got["c-2"] == ""
    assert "sharing.strategy" in got["c-3"]


def test_the_policy_is_the_release_drivers_and_can_be_left_out() -> None:
    manifests = _policy_manifests(driverName="gpu.example.com")
    [policy] = [m for m in manifests if m["kind"] == "ValidatingAdmissionPolicy"]
    assert policy["spec"]["failurePolicy"] == "Fail"
    assert policy["spec"]["matchConstraints"]["resourceRules"][0]["operations"] == ["CREATE"]
    assert "c.opaque.driver == 'gpu.example.com'" in json.dumps(policy)
    assert _policy_manifests(validateClaimConfigs=False) == []


def test_the_largest_claim_is_checked_within_the_servers_cel_cost_budget(
    policy: envtest.ControlPlane,
) -> None:
    """32 configs (the API's most) of near 10Ki each (its most per config), each with the
    most per-device limits Prepare takes (128), each limit a long string: the policy still
    answers within the API server's CEL cost limits, as Prepare does: one more limit, or one
    limit too small among them all, is refused naming the field."""
    from tests.core.dra.opaque_corpus import prepare_verdict

    def config(count: int, last: str = "0" * 60 + "1Gi") -> str:
        limits = {str(i): "0" * 60 + "1Gi" for i in range(count - 1)} | {"last": last}
        return json.dumps({"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig",
                           "sharing": {"strategy": "MPS", "mpsConfig": {
                               "defaultPerDevicePinnedMemoryLimit": limits}}})  # fmt: skip

    good, too_many, too_small = config(128), config(129), config(128, last="1Ki")
    assert 9 * 1024 < len(good) <= 10 * 1024
    docs = {
        "c-0": _document("ResourceClaim", "c-0", [good] * 32),
        "c-1": _document("ResourceClaim", "c-1", [good] * 31 + [too_many]),
        "c-2": _document("ResourceClaim", "c-2", [good] * 31 + [too_small]),
    }
    got = _verdicts(policy, "ResourceClaim", docs)
    assert got["c-0"] == "", got["c-0"][-300:]
    assert "defaultPerDevicePinnedMemoryLimit (at most 128)" in got["c-1"], got["c-1"][-300:]
    assert "defaultPerDevicePinnedMemoryLimit (at most 128)" in got["c-2"], got["c-2"][-300:]
    assert [prepare_verdict(c) for c in (good, too_many, too_small)] == [
        "accept", "refuse", "refuse"
    ]  # fmt: skip


def test_a_new_kind_is_admitted_by_the_policy_generated_with_its_registration(
    policy: envtest.ControlPlane,
) -> None:
    """The throwaway kind of tests/core/dra/test_opaque_registry.py (its module and its
    registration line, nothing else): the chart's policy generated with it takes it, and
    refuses what Prepare refuses (its derived field check, its own rule, an unknown field,
    a string for a number); the registry's own policy refuses it as unknown."""
    from gpuslice.core.dra.opaque.base import ClaimConfigError
    from gpuslice.core.dra.sharing import parse_opaque
    from tests.core.dra.test_opaque_registry import EXAMPLE, WITH_EXAMPLE

    raws = {
        "c-0": json.dumps(EXAMPLE),
        "c-1": json.dumps({**EXAMPLE, "pods": 0}),
        "c-2": json.dumps({**EXAMPLE, "pods": 9}),
        "c-3": json.dumps({**EXAMPLE, "podz": 2}),
        "c-4": json.dumps({**EXAMPLE, "pods": "3"}),
        "c-5": GPU_CONFIG,
    }
    docs = {name: _document("ResourceClaim", name, [raw]) for name, raw in raws.items()}
    unknown = _verdicts(policy, "ResourceClaim", {"c-0": docs["c-0"]})["c-0"]
    assert "got resource.example.com/v1 LongSlices" in unknown, unknown
    try:
        _install(policy, _generated_policy(WITH_EXAMPLE), docs["c-0"], refused=False)
        got = _verdicts(policy, "ResourceClaim", docs)
    finally:
        _install(policy, _policy_manifests(), docs["c-0"], refused=True)
    assert got["c-0"] == got["c-5"] == ""
    assert "parameters.pods of LongSlices: a whole number of at least 1; got 0" in got["c-1"]
    assert "parameters.pods: at most 8" in got["c-2"], got["c-2"]
    assert "unknown field(s) LongSlices: podz" in got["c-3"], got["c-3"]
    assert "parameters.pods of LongSlices: a whole number of at least 1; got 3" in got["c-4"]
    for name, raw in raws.items():
        try:
            parse_opaque(json.loads(raw), "config[0].opaque", WITH_EXAMPLE)
            prepare = ""
        except ClaimConfigError as exc:
            prepare = str(exc)
        assert bool(prepare) == bool(got[name]), (name, prepare, got[name])
