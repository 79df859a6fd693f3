"""Opaque config kinds are a registry: a kind is one module's worth of definition plus one
entry in `KINDS`, and `resolve` knows none by name. The throwaway kind below is everything
a new kind needs (its model, the devices it fits, its slot, what it contributes); adding it
to the kinds `resolve` reads is the one registration line."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import pytest
import yaml
from pydantic import Field

from gpuslice.core.dra.opaque.admission import policy_template
from gpuslice.core.dra.opaque.base import GUARD as GUARD_SLOT
from gpuslice.core.dra.opaque.base import (
    SHARING,
    Admission,
    GuardSlot,
    JsonInt,
    OpaqueKind,
    Rule,
    SharingSlot,
    StrictModel,
)
from gpuslice.core.dra.opaque.registry import KINDS
from gpuslice.core.dra.sharing import ClaimConfigError, resolve
from gpuslice.core.jsontypes import Json
from gpuslice.core.sharing.model import SharingStrategy

DRIVER = "gpu.nvidia.com"
EXAMPLE_API = "resource.example.com/v1"
DEVICES: dict[str, Literal["gpu", "mig"]] = {"gpu-0": "gpu", "mig-0": "mig"}
CORPUS = Path(__file__).parents[2] / "configs" / "claims" / "opaque-configs.yaml"


# -- the throwaway kind: what its module would hold --------------------------------------------


class LongSlices(StrictModel):
    api_version: Literal["resource.example.com/v1"] = Field(alias="apiVersion")
    kind: Literal["LongSlices"]
    pods: JsonInt = Field(1, ge=1)
    """Read and checked, but how many pods share a device is the guard slot's to say
    (`GuardConfig.sharedBy`): a sharing kind returns its own slot's record only."""


def _contribute(cfg: LongSlices, source: str) -> SharingSlot:
    return SharingSlot(strategy=SharingStrategy.TIME_SLICING, interval=3, source=source)


def _check(cfg: LongSlices, where: str) -> None:
    if cfg.pods > 8:
        raise ClaimConfigError(f"{where}.parameters.pods: at most 8")


# the admission policy derives `pods` (a whole number of at least 1) from the model; the
# rule `_check` adds is the kind's to say in CEL too
ADMISSION = Admission(
    name="LongSlices",
    covers=frozenset(),
    rules=(
        Rule(
            "variables.ofLongSlices.all(p, !('pods' in p) || type(p.pods) != int || p.pods <= 8)",
            "variables.at + '.config[].opaque.parameters.pods: at most 8'",
        ),
    ),
)

LONG_SLICES = OpaqueKind(
    api_version=EXAMPLE_API,
    kind="LongSlices",
    model=LongSlices,
    slot=SHARING,
    fits=frozenset({"gpu"}),
    contribute=_contribute,
    check=_check,
    admission=ADMISSION,
)

WITH_EXAMPLE = (*KINDS, LONG_SLICES)  # the registration line


# -- helpers ---------------------------------------------------------------------------------


def cfg(params: Json, requests: list[str] | None = None) -> Json:
    return {
        "source": "FromClaim",
        "requests": requests or [],
        "opaque": {"driver": DRIVER, "parameters": params},
    }


def alloc(configs: list[Json], devices: tuple[str, ...] = ("gpu-0",)) -> Json:
    results = [
        {"request": f"r{i}", "driver": DRIVER, "pool": "n1", "device": d}
        for i, d in enumerate(devices)
    ]
    return {"devices": {"results": results, "config": configs}}


EXAMPLE = {"apiVersion": EXAMPLE_API, "kind": "LongSlices", "pods": 3}
GUARD = {"apiVersion": "resource.gpuslice.io/v1alpha1", "kind": "GuardConfig", "mode": "enforce"}
MPS = {"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig",
       "sharing": {"strategy": "MPS"}}  # fmt: skip


def test_a_registered_kind_is_read_and_applied() -> None:
    got = resolve(alloc([cfg(EXAMPLE)]), DRIVER, DEVICES, WITH_EXAMPLE)
    # shared_by: 3 (its `pods`) while a kind could write any slot's field; the guard's now
    assert (got[0].shares, got[0].interval, got[0].shared_by, got[0].source) == (
        SharingStrategy.TIME_SLICING,
        3,
        None,
        "config[0]",
    )


def test_the_same_config_is_unknown_without_its_registration() -> None:
    with pytest.raises(ClaimConfigError, match="unknown config kind 'LongSlices'") as err:
        resolve(alloc([cfg(EXAMPLE)]), DRIVER, DEVICES)
    assert "resource.nvidia.com/v1beta1 GpuConfig" in str(err.value)
    assert "LongSlices" not in str(err.value).split("known:")[1]


def test_a_new_kind_takes_part_in_nvidias_precedence_in_its_slot() -> None:
    """Same slot as GpuConfig: the later claim config wins, whichever kind it is; another
    slot's kind (GuardConfig) combines with it instead."""
    later_example = resolve(alloc([cfg(MPS), cfg(EXAMPLE), cfg(GUARD)]), DRIVER, DEVICES,
                            WITH_EXAMPLE)  # fmt: skip
    assert (later_example[0].shares, later_example[0].guard_mode) == (
        SharingStrategy.TIME_SLICING,
        "enforce",
    )
    later_mps = resolve(alloc([cfg(EXAMPLE), cfg(MPS)]), DRIVER, DEVICES, WITH_EXAMPLE)
    assert later_mps[0].shares is SharingStrategy.MPS


def test_a_kind_sets_its_own_slot_and_no_other() -> None:
    """Issue 42: on main a kind returned the whole `Sharing`, so a sharing kind could write
    `shared_by` and a GuardConfig beside it (mode only) reset it to None. Each slot now has
    its own record: the sharing kind's and the guard's both survive, whichever comes first,
    in the claim or in the registry."""
    guard = {**GUARD, "sharedBy": 2}
    reversed_kinds = tuple(reversed(WITH_EXAMPLE))
    for configs in ([cfg(EXAMPLE), cfg(guard)], [cfg(guard), cfg(EXAMPLE)]):
        for kinds in (WITH_EXAMPLE, reversed_kinds):
            got = resolve(alloc(configs), DRIVER, DEVICES, kinds)[0]
            assert got.sharing == SharingSlot(SharingStrategy.TIME_SLICING, 3, None, got.source)
            assert got.guard == GuardSlot(mode="enforce", shared_by=2)
    mode_only = resolve(alloc([cfg(EXAMPLE), cfg(GUARD)]), DRIVER, DEVICES, WITH_EXAMPLE)[0]
    assert (mode_only.interval, mode_only.guard) == (3, GuardSlot(mode="enforce"))


def test_a_kind_returning_another_slots_record_is_refused() -> None:
    """mypy refuses such a kind where it is typed; `resolve` refuses one typed loosely."""
    sneaky: OpaqueKind[Any, Any] = OpaqueKind(
        api_version=EXAMPLE_API,
        kind="LongSlices",
        model=LongSlices,
        slot=GUARD_SLOT,
        fits=frozenset({"gpu"}),
        contribute=_contribute,
    )
    with pytest.raises(TypeError, match="returned a SharingSlot, not its slot's GuardSlot"):
        resolve(alloc([cfg(EXAMPLE)]), DRIVER, DEVICES, (*KINDS, sneaky))


def test_a_new_kind_is_held_to_the_devices_it_fits() -> None:
    devices = ("gpu-0", "mig-0")
    unnamed = resolve(alloc([cfg(EXAMPLE)], devices), DRIVER, DEVICES, WITH_EXAMPLE)
    assert (unnamed[0].shares, unnamed[1].shares) == (
        SharingStrategy.TIME_SLICING,
        SharingStrategy.NONE,
    )
    with pytest.raises(ClaimConfigError, match="LongSlices names request 'r1'"):
        resolve(alloc([cfg(EXAMPLE, ["r1"])], devices), DRIVER, DEVICES, WITH_EXAMPLE)


def test_a_new_kind_is_read_strictly_and_checked() -> None:
    with pytest.raises(ClaimConfigError, match="podz"):
        resolve(alloc([cfg({**EXAMPLE, "podz": 2})]), DRIVER, DEVICES, WITH_EXAMPLE)
    with pytest.raises(ClaimConfigError, match=r"config\[0\]\.opaque\.parameters\.pods: at most"):
        resolve(alloc([cfg({**EXAMPLE, "pods": 9})]), DRIVER, DEVICES, WITH_EXAMPLE)


def test_registered_kinds_are_distinct_and_each_is_in_the_admission_corpus() -> None:
    """The corpus is what Prepare and the chart's admission policy are both held to: a kind
    registered without an accepted entry there would be checked by one and not the other."""
    pairs = [(k.api_version, k.kind) for k in KINDS]
    assert len(set(pairs)) == len(pairs)
    accepted = set()
    for entry in yaml.safe_load(CORPUS.read_text())["configs"]:
        params = yaml.safe_load(entry["parameters"])
        if entry["verdict"] == "accept" and isinstance(params, dict):
            accepted.add((params.get("apiVersion"), params.get("kind")))
    assert set(pairs) <= accepted


def test_the_admission_policy_generated_with_a_new_kind_takes_it() -> None:
    """The chart's policy is generated from the kinds (`scripts/gen-claim-policy`): with the
    registration, the kind is one the policy knows, with its fields, its derived checks and
    its own rule; without it, the kind is refused as unknown. tests/real_k8s runs both on
    the API server (test_claim_config_policy.py)."""
    # the template's CEL is folded over lines: compared with its whitespace joined
    with_it, without = (" ".join(policy_template(k).split()) for k in (WITH_EXAMPLE, KINDS))
    assert "'resource.example.com/v1 LongSlices': ['apiVersion', 'kind', 'pods']" in with_it
    assert "parameters.pods of LongSlices: a whole number of at least 1" in with_it
    assert "parameters.pods: at most 8" in with_it
    assert "LongSlices" not in without
