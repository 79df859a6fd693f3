"""`gpuslice demo --scenario dynamic-mig`: the real agent in DRA mode with `flags.dynamicMig`
on an emulated H100; every step's values come from the agent and the simulated GPU."""

from __future__ import annotations

from click.testing import CliRunner

from gpuslice.cli.main import main
from gpuslice.demo.dynmig_scene import run_dynamic_mig_demo


async def test_the_scene_creates_and_destroys_what_the_claims_ask_for() -> None:
    result = await run_dynamic_mig_demo()
    published, placed, refused, freed, done = result.steps
    assert len(published.devices) == 25
    assert all(d.type == "mig" for d in published.devices)
    assert "gpu-0-counter-set" in published.note
    assert [c.devices for c in placed.claims] == [
        (("mig", "gpu-0-mig-4g40gb-5-0"),),
        (("mig", "gpu-0-mig-3g40gb-9-4"),),
    ]
    visible = [dict(p.env)["NVIDIA_VISIBLE_DEVICES"] for p in placed.pods]
    assert all(v.startswith("MIG-") for v in visible)
    assert len(set(visible)) == 2
    assert "4g.40gb at memory slices 0:4" in placed.note
    assert "3g.40gb at memory slices 4:4" in placed.note
    assert "counter gpu-0-counter-set/" in refused.note
    assert [c.devices for c in freed.claims][1] == (("mig", "gpu-0-mig-1g10gb-19-4"),)
    assert "3g.40gb" not in freed.note
    assert done.note == "MIG devices on the GPU: none"
    assert done.cdi_specs == ()


def test_the_cli_runs_the_scene() -> None:
    out = CliRunner().invoke(main, ["demo", "--scenario", "dynamic-mig"], env={"COLUMNS": "200"})
    assert out.exit_code == 0, out.output
    assert "Prepare created each MIG device" in out.output
