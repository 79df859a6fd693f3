"""The corpus of opaque configs that Prepare and the chart's admission policy are both held
to (tests/configs/claims/opaque-configs.yaml): here Prepare's verdicts, through the path a
claim takes at Prepare (`resolve`, the claim read as JSON); the real API server's are in
tests/real_k8s/test_claim_config_policy.py. Where Prepare once read more than JSON says
(`"50"` or `true` as a number, `0` or `"false"` as a boolean, `mps_config` for `mpsConfig`)
the policy could not agree with it, nor NVIDIA's strict decoder."""

from __future__ import annotations

import json

import pytest

from gpuslice.core.dra.sharing import ClaimConfigError, resolve
from gpuslice.core.jsontypes import Json
from tests.core.dra.opaque_corpus import DRIVER, corpus, prepare_verdict


@pytest.mark.parametrize(
    "entry", corpus(), ids=[f"{i}-{e['verdict']}" for i, e in enumerate(corpus())]
)
def test_prepare_gives_the_corpus_verdict(entry: Json) -> None:
    assert prepare_verdict(entry["parameters"]) == entry["verdict"], entry["parameters"]


def test_the_corpus_has_both_verdicts_and_no_repeats() -> None:
    entries = corpus()
    assert {e["verdict"] for e in entries} == {"accept", "refuse"}
    raws = [e["parameters"] for e in entries]
    assert len(raws) == len(set(raws))


@pytest.mark.parametrize(
    ("raw", "named"),
    [
        ('{"strategy": "MPS", "mps_config": {}}', "mps_config: unknown field"),
        ('{"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": "50"}}',
         "defaultActiveThreadPercentage: Value error, must be a number"),
        ('{"strategy": "MPS", "mpsConfig": {"multiUser": 0}}', "multiUser: expected true or false"),
        ('{"strategy": "MPS", "mpsConfig": {"defaultPinnedDeviceMemoryLimit": "' + "9" * 400
         + '"}}', "defaultPinnedDeviceMemoryLimit: Value error, too large"),
    ],
)  # fmt: skip
def test_what_json_does_not_say_is_refused_naming_the_field(raw: str, named: str) -> None:
    """Each once passed, or (a quantity of 400 digits) raised OverflowError, not a refusal."""
    head = '{"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig", "sharing": '
    opaque = {"driver": DRIVER, "parameters": json.loads(head + raw + "}")}
    config = {"source": "FromClaim", "opaque": opaque}
    result = {"request": "gpu", "driver": DRIVER, "pool": "n1", "device": "gpu-0"}
    allocation = {"devices": {"results": [result], "config": [config]}}
    with pytest.raises(ClaimConfigError) as err:
        resolve(allocation, DRIVER, {"gpu-0": "gpu"})
    assert named in str(err.value)
    assert "config[0].opaque.parameters: sharing." in str(err.value)
