"""`describe --claims` on a node with dynamic MIG GPUs: which profile and placement each
claim would get, the MIG device Prepare would create for it (its CDI edits with the
capability nodes), and the scheduler's reason when a claim would not fit."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema

from gpuslice.backends import open_backend
from gpuslice.core.config import parse_config
from gpuslice.core.dra.partitions import WOULD_BE_UUID
from gpuslice.core.sharing.plan import build_plan
from gpuslice.whatif.claims import WhatIf, what_if, what_if_to_dict

ROOT = Path(__file__).resolve().parents[3]
SCHEMA = json.loads((ROOT / "docs/schemas/describe-claims.schema.json").read_text("utf-8"))


def claim(name: str, profile: str | None = None, cls: str = "mig.nvidia.com") -> dict[str, object]:
    request: dict[str, object] = {"deviceClassName": cls}
    if profile is not None:
        expression = f"device.attributes['gpu.nvidia.com'].profile == '{profile}'"
        request["selectors"] = [{"cel": {"expression": expression}}]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "ml"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": request}]}},
    }


def report(spec: str, claims: list[dict[str, object]], dynamic: tuple[str, ...]) -> WhatIf:
    inventory = open_backend(spec).inventory()
    plan = build_plan(inventory, parse_config("version: v1\n"))
    out = what_if(inventory, plan, claims, dynamic=dynamic)
    jsonschema.validate(what_if_to_dict(out), SCHEMA)
    return out


def test_each_claim_gets_a_placement_and_the_eighth_1g_is_told_why_not() -> None:
    claims = [claim(f"c{i}", "1g.10gb") for i in range(8)] + [claim("four", "4g.40gb")]
    out = report("sim:1xh100-80gb/mig=", claims, ("all",))
    fitting = [c for c in out.claims if c.fits]
    assert len(fitting) == 7
    placements = [c.devices[0].placement for c in fitting]
    assert placements == [f"{s}:1" for s in range(7)]
    first = fitting[0].devices[0]
    assert first.created_at_prepare
    assert first.uuid == f"{WOULD_BE_UUID}-gpu0-0"
    assert any(k == "NVIDIA_VISIBLE_DEVICES" for k, _ in first.env)
    eighth, four = [c for c in out.claims if not c.fits]
    assert eighth.stage == "allocate"
    assert "no device left" in eighth.error  # every 1g.10gb placement is allocated
    # the 4g.40gb overlaps them: the counter that is used up is named
    assert "gpu-0-mig-4g40gb-5-0 needs 4 of counter gpu-0-counter-set/compute-slices, 0 left" in (
        four.error
    )


def test_a_dynamic_gpu_offers_no_whole_gpu_claim_its_bare_gpu() -> None:
    """In MIG mode CUDA runs only in MIG devices: a whole-GPU claim fits nowhere, before or
    after a MIG claim, as NVIDIA's driver offers no such GPU whole."""
    out = report(
        "sim:1xh100-80gb/mig=",
        [claim("whole", cls="gpu.nvidia.com"), claim("small", "3g.40gb")],
        ("all",),
    )
    whole, small = out.claims
    assert not whole.fits
    assert whole.stage == "allocate"
    assert "no device matches device class 'gpu.nvidia.com'" in whole.error
    assert small.fits
    assert small.devices[0].device == "gpu-0-mig-3g40gb-9-0"


def test_without_the_marker_the_gpu_offers_what_it_holds() -> None:
    out = report("sim:1xh100-80gb/mig=", [claim("c", "1g.10gb")], ())
    [c] = out.claims
    assert not c.fits  # MIG mode, no instance, not dynamic: nothing to allocate
    assert c.stage == "allocate"


def test_describe_claims_reads_the_marker_from_the_config_file(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from gpuslice.cli.main import main

    config = tmp_path / "config.yaml"
    config.write_text("version: v1\nflags:\n  dynamicMig:\n    devices: [0]\n")
    claims = tmp_path / "claims.yaml"
    claims.write_text(json.dumps(claim("big", "4g.40gb")))
    args = ["describe", "--node", "sim:1xh100-80gb/mig=", "--config-file", str(config)]
    out = CliRunner().invoke(main, [*args, "--claims", str(claims), "-o", "json"])
    assert out.exit_code == 0, out.output
    report = json.loads(out.output)
    jsonschema.validate(report, SCHEMA)
    [device] = report["claims"][0]["devices"]
    assert (device["device"], device["placement"], device["created_at_prepare"]) == (
        "gpu-0-mig-4g40gb-5-0",
        "0:4",
        True,
    )
