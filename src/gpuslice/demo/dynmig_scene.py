"""`gpuslice demo --scenario dynamic-mig`: dynamic MIG on an emulated H100, end to end.

The real agent in DRA mode (as `demo --dra` runs it) with `flags.dynamicMig` on its one
H100 in MIG mode with no instance: it publishes the GPU's counter set and its 25 partitions
(not the whole GPU: in MIG mode CUDA runs only in MIG devices). Claims ask for profiles;
the scheduler double (`DraStore`, the emulator's allocator, which counts shared counters as
kube-scheduler does) places them;
Prepare creates the MIG devices on the simulated GPU and Unprepare destroys them. Every
value shown comes back from the agent or the simulated GPU: the published devices, the
allocations, the CDI env, the GPU's MIG devices after each step.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from gpuslice.core.devices import MigDevice
from gpuslice.core.dra.kubelet_api import ClaimRef
from gpuslice.core.jsontypes import Json
from gpuslice.demo.dra_scenario import (
    NAMESPACE,
    NODE_NAME,
    DemoError,
    DraDemoResult,
    DraStep,
    _add_and_allocate,
    _claim_view,
    _Node,
    _pod_view,
    _prepare,
    _running_dra_node,
)
from gpuslice.whatif.allocator import AllocationError
from gpuslice.whatif.claims import DRIVER, slice_devices

DYNAMIC_NODE = "sim:1xh100-80gb/mig="
"""One H100 in MIG mode with no instance: dynamic MIG makes them."""
DYNAMIC_CONFIG = "version: v1\nflags:\n  migStrategy: mixed\n  dynamicMig: {}\n"


def profile_claim(name: str, profile: str) -> Json:
    selector = f"device.attributes['gpu.nvidia.com'].profile == '{profile}'"
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": "mig",
                        "exactly": {
                            "deviceClassName": "mig.nvidia.com",
                            "selectors": [{"cel": {"expression": selector}}],
                        },
                    }
                ]
            }
        },
    }


def _migs(node: _Node) -> tuple[MigDevice, ...]:
    backend: Any = node.agent.backend
    gpu = node.agent.backend.inventory().gpus[0]
    return tuple(backend.live_mig_devices(gpu.uuid))


def _on_gpu(node: _Node) -> str:
    migs = _migs(node)
    if not migs:
        return "MIG devices on the GPU: none"
    shown = ", ".join(
        f"{m.profile} at memory slices {m.placement_start}:{m.placement_size} (GI {m.gi_id})"
        for m in migs
    )
    return f"MIG devices on the GPU: {shown}"


async def run_dynamic_mig_demo(node: str = DYNAMIC_NODE) -> DraDemoResult:
    result = DraDemoResult(node=node, driver=DRIVER, node_name=NODE_NAME)
    with tempfile.TemporaryDirectory(prefix="gsdmig-", dir="/tmp") as tmp:
        async with _running_dra_node(node, Path(tmp), DYNAMIC_CONFIG) as n:
            slices = n.store.slices(node=NODE_NAME, driver=DRIVER)
            sets = [c["name"] for s in slices for c in s["spec"].get("sharedCounters") or ()]
            result.steps.append(
                DraStep(
                    "flags.dynamicMig: the GPU publishes every profile and placement it can hold",
                    note=f"counter sets: {', '.join(sets)}; {_on_gpu(n)}",
                    devices=slice_devices(slices),
                )
            )

            refs = {}
            for name, profile, pod in (
                ("big", "4g.40gb", "trainer-0"),
                ("half", "3g.40gb", "notebook-0"),
            ):
                refs[name] = _add_and_allocate(n, profile_claim(name, profile), (pod,))
            pods = []
            for name, pod in (("big", "trainer-0"), ("half", "notebook-0")):
                ref = refs[name]
                prepared = await _prepare(n, ref)
                pods.append(
                    _pod_view(n, pod, f"{ref.namespace}/{ref.name}", prepared, prepared=True)
                )
            result.steps.append(
                DraStep(
                    "claims by profile (4g.40gb, 3g.40gb): the scheduler picks the placements, "
                    "Prepare creates the MIG devices",
                    note=_on_gpu(n),
                    claims=tuple(_claim_view(n.store, NAMESPACE, r) for r in ("big", "half")),
                    pods=tuple(pods),
                    cdi_specs=n.cdi_specs(),
                )
            )

            small = n.store.add_claim(profile_claim("small", "1g.10gb"))
            try:
                n.store.allocate_claim(
                    NAMESPACE, "small", pod_uid="uid-batch-0", pod_name="batch-0"
                )
            except AllocationError as exc:
                refused = str(exc)
            else:
                raise DemoError("a 1g.10gb claim was allocated on a GPU the 4g and 3g fill")
            result.steps.append(
                DraStep(
                    "a 1g.10gb claim: the GPU is full, the scheduler says which counter is",
                    note=refused,
                    claims=(_claim_view(n.store, NAMESPACE, "small"),),
                )
            )

            errors = await n.kubelet.unprepare(DRIVER, [refs["half"]])
            if any(errors.values()):
                raise DemoError(f"NodeUnprepareResources failed: {errors}")
            n.store.set_claim_status(NAMESPACE, "half", None)  # deallocated with its pod
            n.store.allocate_claim(NAMESPACE, "small", pod_uid="uid-batch-0", pod_name="batch-0")
            small_ref = ClaimRef(NAMESPACE, str(small["metadata"]["uid"]), "small")
            prepared = await _prepare(n, small_ref)
            result.steps.append(
                DraStep(
                    "the 3g.40gb pod is deleted: Unprepare destroys its MIG device, and the "
                    "1g.10gb claim gets a placement in the freed slices",
                    note=_on_gpu(n),
                    claims=tuple(_claim_view(n.store, NAMESPACE, r) for r in ("big", "small")),
                    pods=(_pod_view(n, "batch-0", f"{NAMESPACE}/small", prepared, prepared=True),),
                    cdi_specs=n.cdi_specs(),
                )
            )

            errors = await n.kubelet.unprepare(DRIVER, [refs["big"], small_ref])
            if any(errors.values()):
                raise DemoError(f"NodeUnprepareResources failed: {errors}")
            if _migs(n):
                raise DemoError(f"MIG devices left after Unprepare: {_migs(n)}")
            result.steps.append(
                DraStep(
                    "all pods deleted: every MIG device gpuslice created is destroyed",
                    note=_on_gpu(n),
                    cdi_specs=n.cdi_specs(),
                )
            )
    return result
