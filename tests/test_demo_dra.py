"""`gpuslice demo --dra` runs the real DRA driver: its numbers are the driver's, and its
what-if step must agree with what the driver did (they share the node and the claims)."""

from __future__ import annotations

import json

from click.testing import CliRunner

from gpuslice.cli.main import main
from gpuslice.demo.dra_scenario import run_dra_demo


async def test_dra_demo_publishes_shares_one_mps_claim_picks_mig_by_cel_and_cleans_up() -> None:
    result = await run_dra_demo()
    published, shared, mig, predicted, unprepared = result.steps

    # 1. one whole H100 and seven 1g.10gb MIG devices of the other
    types = [d.type for d in published.devices]
    assert (types.count("gpu"), types.count("mig")) == (1, 7)
    assert {d.profile for d in published.devices if d.type == "mig"} == {"1g.10gb"}
    by_name = {d.name: d for d in published.devices}

    # 2. two pods, one claim, prepared once: one CDI device ID and the MPS daemon's pipe
    (claim,) = shared.claims
    assert claim.devices == (("gpu", "gpu-0"),)
    assert len(claim.reserved_for) == 2
    first, second = shared.pods
    assert (first.prepared, second.prepared) == (True, False)
    assert first.cdi_ids == second.cdi_ids
    assert len(first.cdi_ids) == 1
    assert first.cdi_ids[0] == f"k8s.gpuslice.io/claim={claim.uid}-gpu-0"
    env = dict(first.env)
    assert env["NVIDIA_VISIBLE_DEVICES"] == by_name["gpu-0"].uuid
    assert env["CUDA_MPS_PIPE_DIRECTORY"] == "/tmp/nvidia-mps"
    (daemon,) = shared.mps_daemons
    assert daemon.ready
    assert [m.host_path for m in first.mounts if m.container_path == "/tmp/nvidia-mps"] == [
        daemon.pipe_dir
    ]
    # the daemon itself answers with the claim's GpuConfig (50 %, 20Gi on GPU 0), the limit
    # in whole GiB as the real daemon prints it
    assert (daemon.active_thread_percentage, daemon.pinned_limits) == ("50.0", ((0, "20G"),))
    assert shared.cdi_specs == (f"k8s.gpuslice.io-claim_{claim.uid}.yaml",)

    # 3. the MIG pod got the UUID of the MIG device the CEL selector picked
    (mig_claim,) = mig.claims
    ((_, device),) = mig_claim.devices
    assert by_name[device].profile == "1g.10gb"
    (pod,) = mig.pods
    assert dict(pod.env)["NVIDIA_VISIBLE_DEVICES"] == by_name[device].uuid
    assert by_name[device].uuid.startswith("MIG-")
    assert len(mig.cdi_specs) == 2

    # 4. the what-if predicted exactly what the driver wrote, and refuses the extra GPU
    assert predicted.what_if is not None
    mps_w, mig_w, extra = predicted.what_if.claims
    assert mps_w.fits
    assert mig_w.fits
    assert not extra.fits
    assert mps_w.devices[0].env == first.env
    assert tuple(mps_w.devices[0].mounts) == first.mounts
    assert mig_w.devices[0].env == pod.env
    assert extra.stage == "allocate"
    assert "gpu-0" in extra.error

    # 5. unprepared: no CDI spec, no MPS daemon left
    assert unprepared.cdi_specs == ()
    assert unprepared.mps_daemons == ()


def test_gpuslice_demo_dra_prints_each_step_and_exits_0() -> None:
    result = CliRunner().invoke(main, ["demo", "--dra"], env={"COLUMNS": "140"})
    assert result.exit_code == 0, result.output
    out = result.stdout
    for line in (
        "1. driver registered with the kubelet",
        "gpu-1-mig-1g10gb-19-6",
        "CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps",
        "default active thread percentage 50.0, pinned memory limit GPU 0: 20G",
        "kubelet reused it",
        "mig → gpu-1-mig-1g10gb-19-0",
        "not allocated",
        "CDI specs on the node: (none)",
        "Summary",
    ):
        assert line in out, line
    assert "Traceback" not in result.output


def test_gpuslice_demo_dra_json_has_the_five_steps() -> None:
    result = CliRunner().invoke(main, ["demo", "--dra", "-o", "json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert len(doc["steps"]) == 5
    assert doc["steps"][4]["cdi_specs"] == []


def test_a_node_without_mig_is_one_error_line_not_a_traceback() -> None:
    """--node applies to --dra; a node the scenario cannot run on says what it needs."""
    result = CliRunner().invoke(main, ["demo", "--dra", "--node", "sim:1xt4"])
    assert result.exit_code == 2
    assert result.stderr.startswith("error: claim default/small-mig: request 'mig'")
    assert "1g.10gb MIG devices" in result.stderr
    assert result.stderr.count("\n") == 1
