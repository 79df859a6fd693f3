"""The scheduler's side of DRA as the demo and the driver tests rely on it: NVIDIA's
DeviceClasses and CEL selectors over the devices our publisher produces, counts, shared
counters, consumable shares, constraints, taints and config copying."""

from __future__ import annotations

import copy
import itertools
import re
from collections.abc import Callable, Sequence
from typing import Any

import pytest

from gpuslice.backends import open_backend
from gpuslice.core.dra.publish import Health, device_json, dra_devices, slice_specs, taints
from gpuslice.core.jsontypes import Json
from gpuslice.core.units import Quantity
from gpuslice.whatif.allocator import AllocationError, Version, allocate

DRIVER = "gpu.nvidia.com"
MIXED = "sim:1xa100-40gb,1xh100-80gb,1xh100-80gb"
MIG_AND_WHOLE = "sim:1xa100-40gb/mig=3g.20gb*1+2g.10gb*1+1g.5gb*2,1xa100-40gb"


def nvidia_class(name: str, kind: str, config: Sequence[Json] = ()) -> Json:
    """The DeviceClasses NVIDIA's chart installs (REFERENCE-DRA §5.2)."""
    expression = f"device.driver == '{DRIVER}' && device.attributes['{DRIVER}'].type == '{kind}'"
    spec: Json = {"selectors": [{"cel": {"expression": expression}}]}
    if config:
        spec["config"] = list(config)
    return {"metadata": {"name": name}, "spec": spec}


CLASSES = [nvidia_class("gpu.nvidia.com", "gpu"), nvidia_class("mig.nvidia.com", "mig")]


def devices(
    node_spec: str,
    health: Health | None = None,
    shares: int | None = None,
) -> list[Json]:
    """Our publisher's devices for a simulated node; `shares` offers every whole GPU as
    consumable shares the way the DRA design note describes."""
    backend = open_backend(node_spec)
    try:
        inventory = backend.inventory()
    finally:
        backend.close()
    out = []
    for d in dra_devices(inventory):
        body = device_json(d, taints(d, health, DRIVER, "2026-01-01T00:00:00Z") if health else [])
        if shares and d.kind == "gpu":
            body["allowMultipleAllocations"] = True
            body["capacity"]["memory"]["requestPolicy"] = {
                "default": f"{d.gpu.memory_mib // shares}Mi",
                "validRange": {"min": "1Mi", "step": "1Mi"},
            }
            body["capacity"]["gpuslice.io/shares"] = {
                "value": str(shares),
                "requestPolicy": {
                    "default": "1",
                    "validRange": {"min": "1", "max": str(shares), "step": "1"},
                },
            }
        out.append(body)
    return out


def slices(device_list: Sequence[Json], node: str = "n1", generation: int = 1) -> list[Json]:
    specs = slice_specs(device_list, driver=DRIVER, node=node, generation=generation)
    return [
        {"metadata": {"name": f"{node}-{DRIVER}-{i:02x}-abcde"}, "spec": spec}
        for i, spec in enumerate(specs)
    ]


def exact(name: str, device_class: str = "gpu.nvidia.com", *selectors: str, **more: Any) -> Json:
    body: Json = {"deviceClassName": device_class, **more}
    if selectors:
        body["selectors"] = [{"cel": {"expression": s}} for s in selectors]
    return {"name": name, "exactly": body}


def claim(*requests: Json, constraints: Sequence[Json] = (), config: Sequence[Json] = ()) -> Json:
    spec: Json = {"requests": list(requests)}
    if constraints:
        spec["constraints"] = list(constraints)
    if config:
        spec["config"] = list(config)
    return {"metadata": {"namespace": "ml", "name": "c"}, "spec": {"devices": spec}}


def picked(allocation: Json) -> list[str]:
    return [r["device"] for r in allocation["devices"]["results"]]


def counter() -> Callable[[], str]:
    numbers = itertools.count(1)
    return lambda: f"share-{next(numbers)}"


# -- classes and selectors ----------------------------------------------------------------


def test_nvidia_classes_tell_whole_gpus_from_mig_devices() -> None:
    offer = slices(devices(MIG_AND_WHOLE))
    whole = allocate(claim(exact("gpu", "gpu.nvidia.com")), CLASSES, offer, node="n1")
    assert picked(whole) == ["gpu-1"]  # gpu-0 is in MIG mode: only its MIG devices exist
    assert whole["devices"]["results"][0] == {
        "request": "gpu",
        "driver": DRIVER,
        "pool": "n1",
        "device": "gpu-1",
    }
    mig = allocate(claim(exact("part", "mig.nvidia.com")), CLASSES, offer, node="n1")
    assert picked(mig) == ["gpu-0-mig-3g20gb-9-4"]
    small = allocate(
        claim(
            exact("part", "mig.nvidia.com", f"device.attributes['{DRIVER}'].profile == '1g.5gb'")
        ),
        CLASSES,
        offer,
    )
    assert picked(small) == ["gpu-0-mig-1g5gb-19-0"]
    assert whole["nodeSelector"] == {
        "nodeSelectorTerms": [
            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}
        ]
    }


@pytest.mark.parametrize(
    ("selector", "expected"),
    [
        (f"device.attributes['{DRIVER}'].productName == 'NVIDIA H100 80GB HBM3'", ["gpu-1"]),
        (f"device.attributes['{DRIVER}'].productName.startsWith('NVIDIA A100')", ["gpu-0"]),
        (f"device.capacity['{DRIVER}'].memory.isGreaterThan(quantity('40Gi'))", ["gpu-1"]),
        (f"device.capacity['{DRIVER}'].memory.compareTo(quantity('40Gi')) == 0", ["gpu-0"]),
        (f"device.capacity['{DRIVER}'].memory.isLessThan(quantity('79Gi'))", ["gpu-0"]),
        (f"device.capacity['{DRIVER}'].memory >= quantity('80G')", ["gpu-1"]),
        (f"device.attributes['{DRIVER}'].cudaComputeCapability >= semver('9.0.0')", ["gpu-1"]),
        (
            f"device.attributes['{DRIVER}'].cudaComputeCapability.isLessThan(semver('9.0.0'))",
            ["gpu-0"],
        ),
        (f"device.attributes['{DRIVER}'].driverVersion == semver('550.54.15')", ["gpu-0"]),
        (
            f"device.attributes['{DRIVER}'].driverVersion.isGreaterThan(semver('550.54.2'))",
            ["gpu-0"],
        ),
        (
            f"device.attributes['{DRIVER}'].driverVersion.compareTo(semver('551.0.0')) < 0",
            ["gpu-0"],
        ),
        (f"device.attributes['{DRIVER}'].driverVersion.major() == 550", ["gpu-0"]),
        (
            f"has(device.attributes['{DRIVER}'].uuid) && !device.allowMultipleAllocations",
            ["gpu-0"],
        ),
        (f"has(device.attributes['example.com'].x) || device.driver == '{DRIVER}'", ["gpu-0"]),
    ],
)
def test_cel_selectors_over_published_attributes(selector: str, expected: list[str]) -> None:
    offer = slices(devices(MIXED))
    versions = {d["attributes"]["driverVersion"]["version"] for d in devices(MIXED)}
    assert versions == {"550.54.15"}  # what the version selectors above assume
    assert picked(allocate(claim(exact("gpu", "gpu.nvidia.com", selector)), CLASSES, offer)) == (
        expected
    )


def test_qualified_attributes_are_under_their_own_domain() -> None:
    published = devices(MIXED)
    bus = published[2]["attributes"]["resource.kubernetes.io/pciBusID"]["string"]
    selector = f"device.attributes['resource.kubernetes.io'].pciBusID == '{bus}'"
    assert picked(
        allocate(claim(exact("gpu", "gpu.nvidia.com", selector)), CLASSES, slices(published))
    ) == ["gpu-2"]
    unqualified = f"device.attributes['{DRIVER}'].pciBusID == '{bus}'"
    with pytest.raises(AllocationError, match="pciBusID"):
        allocate(claim(exact("gpu", "gpu.nvidia.com", unqualified)), CLASSES, slices(published))


def test_class_and_request_selectors_must_all_hold() -> None:
    offer = slices(devices(MIG_AND_WHOLE))
    only_whole = f"device.attributes['{DRIVER}'].type == 'gpu'"
    wants_mig_profile = f"device.attributes['{DRIVER}'].profile == '1g.5gb'"
    with pytest.raises(AllocationError) as err:
        allocate(claim(exact("gpu", "gpu.nvidia.com", wants_mig_profile)), CLASSES, offer)
    message = str(err.value)
    assert "claim ml/c" in message
    assert "request 'gpu'" in message
    assert "device class 'gpu.nvidia.com'" in message
    assert "profile" in message  # the CEL error on gpu-1, which has no profile
    assert picked(allocate(claim(exact("gpu", "gpu.nvidia.com", only_whole)), CLASSES, offer)) == [
        "gpu-1"
    ]


# -- bad CEL ------------------------------------------------------------------------------


def test_an_expression_that_does_not_compile_is_named() -> None:
    broken = f"device.attributes['{DRIVER}'].type == "
    with pytest.raises(AllocationError) as err:
        allocate(claim(exact("gpu", "gpu.nvidia.com", broken)), CLASSES, slices(devices(MIXED)))
    assert broken in str(err.value)
    assert "does not compile" in str(err.value)
    bad_class = {
        "metadata": {"name": "bad"},
        "spec": {"selectors": [{"cel": {"expression": "device.driver =="}}]},
    }
    with pytest.raises(AllocationError, match=r"device class 'bad'.*device\.driver =="):
        allocate(claim(exact("gpu", "bad")), [bad_class], slices(devices(MIXED)))


@pytest.mark.parametrize(
    ("selector", "shown"),
    [
        ("device.driver", "not bool"),
        (f"device.attributes['{DRIVER}'].productName > 3", "overload"),
        ("semver('not-a-version') == semver('1.0.0')", "not a semantic version"),
        (f"device.capacity['{DRIVER}'].memory == semver('1.0.0')", "overload"),
        ("quantity('12 parsecs').isInteger()", "not a quantity"),
        ("nosuchfunction(device)", "nosuchfunction"),
    ],
)
def test_runtime_errors_mean_no_match_and_are_shown(selector: str, shown: str) -> None:
    with pytest.raises(AllocationError, match="CEL error") as err:
        allocate(claim(exact("gpu", "gpu.nvidia.com", selector)), CLASSES, slices(devices(MIXED)))
    assert shown in str(err.value)
    assert len(str(err.value)) < 1000  # no activation dump


def test_an_unknown_class_is_an_error() -> None:
    with pytest.raises(AllocationError, match=re.escape("device class 'nvidia.com/gpu' not found")):
        allocate(claim(exact("gpu", "nvidia.com/gpu")), CLASSES, slices(devices(MIXED)))


# -- counts -------------------------------------------------------------------------------


def test_exact_count_and_all() -> None:
    offer = slices(devices(MIXED))
    two = allocate(claim(exact("gpus", "gpu.nvidia.com", count=2)), CLASSES, offer)
    assert picked(two) == ["gpu-0", "gpu-1"]
    assert {r["request"] for r in two["devices"]["results"]} == {"gpus"}
    every = allocate(claim(exact("gpus", "gpu.nvidia.com", allocationMode="All")), CLASSES, offer)
    assert picked(every) == ["gpu-0", "gpu-1", "gpu-2"]
    with pytest.raises(AllocationError, match="asks for 4 devices, only 3 match"):
        allocate(claim(exact("gpus", "gpu.nvidia.com", count=4)), CLASSES, offer)
    all_mig = allocate(
        claim(exact("m", "mig.nvidia.com", allocationMode="All")),
        CLASSES,
        slices(devices(MIG_AND_WHOLE)),
    )
    assert len(picked(all_mig)) == 4


def test_allocated_devices_are_skipped_until_exhausted() -> None:
    offer = slices(devices(MIXED))
    held: list[Json] = []
    for expected in ("gpu-0", "gpu-1", "gpu-2"):
        allocation = allocate(claim(exact("gpu")), CLASSES, offer, held)
        assert picked(allocation) == [expected]
        held.append(allocation)
    with pytest.raises(AllocationError) as err:
        allocate(claim(exact("gpu")), CLASSES, offer, held)
    assert "gpu-0 is allocated to another claim" in str(err.value)
    with pytest.raises(AllocationError, match="all devices, gpu-0 is allocated"):
        allocate(claim(exact("g", allocationMode="All")), CLASSES, offer, held[:1])
    # two requests of one claim never share an exclusive device
    pair = allocate(claim(exact("a"), exact("b")), CLASSES, offer, held[:1])
    assert picked(pair) == ["gpu-1", "gpu-2"]


def test_first_available_falls_back_in_order() -> None:
    offer = slices(devices(MIXED))
    b200 = f"device.attributes['{DRIVER}'].productName == 'NVIDIA B200'"
    h100 = f"device.attributes['{DRIVER}'].productName == 'NVIDIA H100 80GB HBM3'"
    request = {
        "name": "gpu",
        "firstAvailable": [
            {
                "name": "b200",
                "deviceClassName": "gpu.nvidia.com",
                "selectors": [{"cel": {"expression": b200}}],
            },
            {
                "name": "h100",
                "deviceClassName": "gpu.nvidia.com",
                "selectors": [{"cel": {"expression": h100}}],
                "count": 2,
            },
            {"name": "any", "deviceClassName": "gpu.nvidia.com"},
        ],
    }
    got = allocate(claim(request), CLASSES, offer)
    assert [(r["request"], r["device"]) for r in got["devices"]["results"]] == [
        ("gpu/h100", "gpu-1"),
        ("gpu/h100", "gpu-2"),
    ]
    got = allocate(claim(request), CLASSES, offer, [got])
    assert [(r["request"], r["device"]) for r in got["devices"]["results"]] == [
        ("gpu/any", "gpu-0")
    ]


# -- pools --------------------------------------------------------------------------------


def test_only_the_newest_complete_generation_counts() -> None:
    current = slices(devices(MIXED), generation=2)
    stale = slices(devices("sim:4xh100-80gb"), generation=1)
    stale[0]["metadata"]["name"] = "n1-old"
    every = allocate(claim(exact("g", allocationMode="All")), CLASSES, stale + current)
    assert picked(every) == ["gpu-0", "gpu-1", "gpu-2"]  # not gpu-3 of generation 1
    incomplete = copy.deepcopy(current)
    incomplete[0]["spec"]["pool"]["resourceSliceCount"] = 2
    with pytest.raises(AllocationError, match="no device matches"):
        allocate(claim(exact("g")), CLASSES, incomplete)


def test_nodes_are_tried_in_order_and_named_in_the_node_selector() -> None:
    offer = slices(devices("sim:1xh100-80gb"), node="n1") + slices(
        devices("sim:1xh100-80gb"), node="n2"
    )
    first = allocate(claim(exact("g")), CLASSES, offer)
    assert (first["devices"]["results"][0]["pool"], picked(first)) == ("n1", ["gpu-0"])
    second = allocate(claim(exact("g")), CLASSES, offer, [first])
    assert second["devices"]["results"][0]["pool"] == "n2"
    assert second["nodeSelector"]["nodeSelectorTerms"][0]["matchFields"][0]["values"] == ["n2"]
    pinned = allocate(claim(exact("g")), CLASSES, offer, node="n2")
    assert pinned["devices"]["results"][0]["pool"] == "n2"
    with pytest.raises(AllocationError, match=r"node n1: .*node n2: "):
        allocate(claim(exact("g")), CLASSES, offer, [first, second])


# -- taints -------------------------------------------------------------------------------


def test_tainted_devices_need_a_toleration() -> None:
    uuids = [d["attributes"]["uuid"]["string"] for d in devices("sim:2xh100-80gb")]
    offer = slices(devices("sim:2xh100-80gb", Health({uuids[0]: 79})))
    assert picked(allocate(claim(exact("g")), CLASSES, offer)) == ["gpu-1"]

    both = slices(devices("sim:2xh100-80gb", Health({uuids[0]: 79, uuids[1]: None})))
    with pytest.raises(AllocationError) as err:
        allocate(claim(exact("g")), CLASSES, both)
    assert "gpu.nvidia.com/xid=79:NoSchedule" in str(err.value)
    assert "gpu.nvidia.com/gpu-lost:NoSchedule" in str(err.value)

    exists = {"key": f"{DRIVER}/xid", "operator": "Exists", "effect": "NoSchedule"}
    got = allocate(claim(exact("g", tolerations=[exists])), CLASSES, both)
    assert picked(got) == ["gpu-0"]
    assert got["devices"]["results"][0]["tolerations"] == [exists]
    wrong_value = {"key": f"{DRIVER}/xid", "operator": "Equal", "value": "48"}
    with pytest.raises(AllocationError):
        allocate(claim(exact("g", tolerations=[wrong_value])), CLASSES, both)
    right_value = dict(wrong_value, value="79")
    assert picked(allocate(claim(exact("g", tolerations=[right_value])), CLASSES, both)) == [
        "gpu-0"
    ]
    everything = {"operator": "Exists"}
    assert picked(
        allocate(claim(exact("g", count=2, tolerations=[everything])), CLASSES, both)
    ) == ["gpu-0", "gpu-1"]


def test_a_none_effect_taint_does_not_block() -> None:
    published = devices("sim:1xh100-80gb")
    published[0]["taints"] = [{"key": f"{DRIVER}/unmonitored", "effect": "None"}]
    assert picked(allocate(claim(exact("g")), CLASSES, slices(published))) == ["gpu-0"]


# -- constraints --------------------------------------------------------------------------


def test_match_attribute_backtracks_past_the_first_fit() -> None:
    offer = slices(devices(MIXED))
    free = allocate(claim(exact("a"), exact("b")), CLASSES, offer)
    assert picked(free) == ["gpu-0", "gpu-1"]  # an A100 and an H100
    same = {"matchAttribute": f"{DRIVER}/productName"}
    matched = allocate(claim(exact("a"), exact("b"), constraints=[same]), CLASSES, offer)
    assert picked(matched) == ["gpu-1", "gpu-2"]
    scoped = dict(same, requests=["b", "c"])  # a is not in it
    three = allocate(
        claim(exact("a"), exact("b"), exact("c"), constraints=[scoped]), CLASSES, offer
    )
    assert picked(three) == ["gpu-0", "gpu-1", "gpu-2"]
    with pytest.raises(AllocationError, match="matchAttribute"):
        allocate(claim(exact("a", count=3), constraints=[same]), CLASSES, offer)


def test_distinct_attribute() -> None:
    offer = slices(devices(MIXED))
    distinct = {"distinctAttribute": f"{DRIVER}/productName"}
    got = allocate(claim(exact("a", count=2), constraints=[distinct]), CLASSES, offer)
    assert picked(got) == ["gpu-0", "gpu-1"]
    with pytest.raises(AllocationError, match="distinctAttribute"):
        allocate(claim(exact("a", count=3), constraints=[distinct]), CLASSES, offer)


# -- shared counters (partitionable devices) ----------------------------------------------


def partitionable() -> list[Json]:
    """NVIDIA's dynamic-MIG shape (1.35+: counters in a slice of their own): the whole
    A100 and its MIG placements all draw on one counter set of eight memory slices."""
    mig = [d for d in devices(MIG_AND_WHOLE) if d["attributes"]["type"]["string"] == "mig"]
    whole = devices("sim:1xa100-40gb")[0]
    whole["consumesCounters"] = [
        {
            "counterSet": "gpu-0-counter-set",
            "counters": {f"memory-slice-{i}": {"value": "1"} for i in range(8)},
        }
    ]
    for d in mig:
        used = [int(k.removeprefix("memorySlice")) for k in d["capacity"] if "Slice" in k]
        d["consumesCounters"] = [
            {
                "counterSet": "gpu-0-counter-set",
                "counters": {f"memory-slice-{i}": {"value": "1"} for i in used},
            }
        ]
    pool = {"name": "n1", "generation": 1, "resourceSliceCount": 2}
    counters = {
        "name": "gpu-0-counter-set",
        "counters": {f"memory-slice-{i}": {"value": "1"} for i in range(8)},
    }
    return [
        {
            "metadata": {"name": "n1-counters"},
            "spec": {
                "driver": DRIVER,
                "nodeName": "n1",
                "pool": pool,
                "sharedCounters": [counters],
            },
        },
        {
            "metadata": {"name": "n1-devices"},
            "spec": {"driver": DRIVER, "nodeName": "n1", "pool": pool, "devices": [whole, *mig]},
        },
    ]


def test_a_whole_gpu_and_its_partitions_share_counters() -> None:
    offer = partitionable()
    whole = allocate(claim(exact("g")), CLASSES, offer)
    assert picked(whole) == ["gpu-0"]
    with pytest.raises(AllocationError, match="counter gpu-0-counter-set/memory-slice-4"):
        allocate(claim(exact("m", "mig.nvidia.com")), CLASSES, offer, [whole])

    small = f"device.attributes['{DRIVER}'].profile == '1g.5gb'"
    part = allocate(claim(exact("m", "mig.nvidia.com", small)), CLASSES, offer)
    assert picked(part) == ["gpu-0-mig-1g5gb-19-0"]
    with pytest.raises(AllocationError, match="memory-slice-0"):
        allocate(claim(exact("g")), CLASSES, offer, [part])
    rest = allocate(claim(exact("m", "mig.nvidia.com", count=3)), CLASSES, offer, [part])
    assert picked(rest) == ["gpu-0-mig-3g20gb-9-4", "gpu-0-mig-2g10gb-14-2", "gpu-0-mig-1g5gb-19-1"]
    # within one claim too: a partition and the whole GPU cannot both be had
    with pytest.raises(AllocationError, match="counter"):
        allocate(claim(exact("m", "mig.nvidia.com", small), exact("g")), CLASSES, offer)


def test_a_device_consuming_a_counter_its_pool_lacks_invalidates_the_pool() -> None:
    """As kube-scheduler 1.36 does ("invalid resource pools were encountered", checked on the
    real one with a `+me` partition left consuming a dropped `ofa-engines`): no claim gets
    any device of the node, not even one whose own counters are all there, so describe
    --claims does not say a claim fits that the scheduler leaves pending."""
    offer = partitionable()
    offer[0]["spec"]["sharedCounters"][0]["counters"].pop("memory-slice-7")
    small = f"device.attributes['{DRIVER}'].profile == '1g.5gb'"
    with pytest.raises(AllocationError) as err:
        allocate(claim(exact("m", "mig.nvidia.com", small)), CLASSES, offer)
    assert str(err.value) == (
        "claim ml/c: invalid resource pools were encountered (pool gpu.nvidia.com/n1: device "
        "gpu-0 consumes counter memory-slice-7 of counter set gpu-0-counter-set, which the "
        "pool does not define)"
    )
    # another node's invalid pool is not this node's concern
    assert picked(
        allocate(
            claim(exact("g")),
            CLASSES,
            [*offer, *slices(devices("sim:1xh100-80gb"), "n2")],
            node="n2",
        )
    ) == ["gpu-0"]


# -- consumable capacity ------------------------------------------------------------------


def test_shares_are_handed_out_until_none_is_left() -> None:
    offer = slices(devices("sim:1xh100-80gb", shares=4))
    held: list[Json] = []
    for _ in range(4):
        allocation = allocate(claim(exact("g")), CLASSES, offer, held)
        result = allocation["devices"]["results"][0]
        assert result["device"] == "gpu-0"
        assert result["consumedCapacity"] == {
            "gpuslice.io/shares": "1",
            "memory": f"{81559 // 4}Mi",
        }
        held.append(allocation)
    share_ids = [a["devices"]["results"][0]["shareID"] for a in held]
    assert len(set(share_ids)) == 4
    assert all(len(s) == 36 for s in share_ids)  # UIDs
    with pytest.raises(AllocationError) as err:
        allocate(claim(exact("g")), CLASSES, offer, held)
    assert "gpu-0 has not enough left: " in str(err.value)
    assert "gpuslice.io/shares (asks 1, 0 of 4 left)" in str(err.value)
    assert f"memory (asks {81559 // 4}Mi, {81559 % 4}Mi of 81559Mi left)" in str(err.value)
    # one claim may take several shares of the same GPU through several requests
    two = allocate(claim(exact("a"), exact("b")), CLASSES, offer, held[:2])
    assert picked(two) == ["gpu-0", "gpu-0"]


def test_memory_asks_are_rounded_and_bounded_by_what_is_left() -> None:
    offer = slices(devices("sim:1xh100-80gb", shares=4))
    ids = counter()
    big = allocate(
        claim(exact("g", capacity={"requests": {"memory": "60Gi"}})), CLASSES, offer, share_id=ids
    )
    assert big["devices"]["results"][0]["shareID"] == "share-1"
    assert big["devices"]["results"][0]["consumedCapacity"]["memory"] == "60Gi"
    with pytest.raises(AllocationError) as err:
        allocate(
            claim(exact("g", capacity={"requests": {"memory": "30Gi"}})), CLASSES, offer, [big]
        )
    assert f"memory (asks 30Gi, {81559 - 60 * 1024}Mi of 81559Mi left)" in str(err.value)
    assert "shares" not in str(err.value)  # one of four shares is taken, three are left
    odd = allocate(
        claim(exact("g", capacity={"requests": {"memory": "1536Ki"}})), CLASSES, offer, [big]
    )
    assert odd["devices"]["results"][0]["consumedCapacity"]["memory"] == "2Mi"  # step 1Mi
    tiny = allocate(claim(exact("g", capacity={"requests": {"memory": "1"}})), CLASSES, offer)
    assert tiny["devices"]["results"][0]["consumedCapacity"]["memory"] == "1Mi"  # the minimum
    with pytest.raises(AllocationError, match="above the maximum 4"):
        allocate(
            claim(exact("g", capacity={"requests": {"gpuslice.io/shares": "5"}})), CLASSES, offer
        )
    with pytest.raises(AllocationError, match="has no capacity 'cores'"):
        allocate(claim(exact("g", capacity={"requests": {"cores": "5"}})), CLASSES, offer)


def test_valid_values_round_up_to_the_next_one() -> None:
    published = devices("sim:1xh100-80gb")
    published[0]["allowMultipleAllocations"] = True
    published[0]["capacity"]["memory"]["requestPolicy"] = {
        "default": "10Gi",
        "validValues": ["5Gi", "10Gi", "40Gi"],
    }
    offer = slices(published)

    def consumed(ask: str | None) -> str:
        request = exact("g", capacity={"requests": {"memory": ask}}) if ask else exact("g")
        result = allocate(claim(request), CLASSES, offer)["devices"]["results"][0]
        return str(result["consumedCapacity"]["memory"])

    assert [consumed(a) for a in ("1Gi", "6Gi", "40Gi", None)] == ["5Gi", "10Gi", "40Gi", "10Gi"]
    with pytest.raises(AllocationError, match="above every valid value"):
        consumed("41Gi")


def test_without_a_policy_an_allocation_takes_the_whole_capacity() -> None:
    published = devices("sim:1xh100-80gb")
    published[0]["allowMultipleAllocations"] = True
    offer = slices(published)
    first = allocate(claim(exact("g")), CLASSES, offer)
    assert first["devices"]["results"][0]["consumedCapacity"] == {
        "memory": published[0]["capacity"]["memory"]["value"]
    }
    with pytest.raises(AllocationError, match="not enough left: memory"):
        allocate(claim(exact("g")), CLASSES, offer, [first])


def test_exclusive_devices_must_have_the_asked_capacity() -> None:
    offer = slices(devices(MIXED))
    got = allocate(claim(exact("g", capacity={"requests": {"memory": "70Gi"}})), CLASSES, offer)
    assert picked(got) == ["gpu-1"]
    assert "consumedCapacity" not in got["devices"]["results"][0]
    with pytest.raises(AllocationError, match="too small: gpu-0 has memory"):
        allocate(claim(exact("g", capacity={"requests": {"memory": "90Gi"}})), CLASSES, offer)


# -- configs ------------------------------------------------------------------------------


def test_class_configs_come_first_then_the_claims_in_order() -> None:
    guard = {
        "opaque": {
            "driver": DRIVER,
            "parameters": {"apiVersion": "resource.gpuslice.io/v1alpha1", "kind": "GuardConfig"},
        }
    }
    classes = [nvidia_class("gpu.nvidia.com", "gpu", [guard]), CLASSES[1]]
    mps = {
        "requests": ["b"],
        "opaque": {
            "driver": DRIVER,
            "parameters": {
                "apiVersion": "resource.nvidia.com/v1beta1",
                "kind": "GpuConfig",
                "sharing": {"strategy": "MPS"},
            },
        },
    }
    catch_all = {"opaque": {"driver": "other.example.com", "parameters": {"x": 1}}}
    got = allocate(
        claim(exact("a"), exact("b"), config=[mps, catch_all]), classes, slices(devices(MIXED))
    )
    assert got["devices"]["config"] == [
        {"source": "FromClass", "requests": ["a"], **guard},
        {"source": "FromClass", "requests": ["b"], **guard},
        {"source": "FromClaim", **mps},
        {"source": "FromClaim", **catch_all},
    ]
    plain = allocate(claim(exact("a")), CLASSES, slices(devices(MIXED)))
    assert "config" not in plain["devices"]  # as the real scheduler leaves it


# -- values -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "value", "canonical"),
    [
        ("40Gi", 40 * 2**30, "40Gi"),
        ("1536Ki", 1536 * 1024, "1536Ki"),
        ("2048Mi", 2**31, "2Gi"),
        ("1.5Gi", 3 * 2**29, "1536Mi"),
        ("80G", 80 * 10**9, "80G"),
        ("85520809984", 85520809984, "85520809984"),
        ("2000", 2000, "2k"),
        ("500m", 0.5, "500m"),
        ("1e3", 1000, "1k"),
        ("0", 0, "0"),
    ],
)
def test_quantities_parse_and_print_canonically(text: str, value: float, canonical: str) -> None:
    q = Quantity.parse(text)
    assert q.value == value
    assert str(q) == canonical
    assert Quantity.parse(str(q)).value == q.value


def test_bad_quantities_are_refused() -> None:
    for text in ("", "Gi", "1.2.3", "4 GB", "1Zi"):
        with pytest.raises(ValueError, match="not a quantity"):
            Quantity.parse(text)


def test_versions_order_by_semver_precedence() -> None:
    ordered = [
        "1.0.0-alpha",
        "1.0.0-alpha.1",
        "1.0.0-alpha.beta",
        "1.0.0-beta",
        "1.0.0-beta.2",
        "1.0.0-beta.11",
        "1.0.0-rc.1",
        "1.0.0",
        "1.2.0",
        "1.10.0",
        "550.54.15",
    ]
    versions = [Version(v) for v in ordered]
    assert sorted(versions[5:] + versions[:5]) == versions
    assert Version("1.0.0+build.5") == Version("1.0.0")
    for bad in ("1.0", "01.0.0", "1.0.0-", "v1.0.0"):
        with pytest.raises(ValueError, match="not a semantic version"):
            Version(bad)
