"""The operator's per-GPU cordon (`gpuslice.io/gpu-cordon`): what an annotation value
names on a node, and what it skips."""

from __future__ import annotations

from gpuslice.backends import open_backend
from gpuslice.core.cordon import MAX_ENTRIES, parse_cordon
from gpuslice.core.devices import Inventory


def inventory(node: str) -> Inventory:
    backend = open_backend(node)
    try:
        return backend.inventory()
    finally:
        backend.close()


def test_uuids_and_indices_cordon_a_gpu_with_its_mig_devices() -> None:
    inv = inventory("sim:2xa100-40gb/mig=3g.20gb*2")
    gpu0, gpu1 = inv.gpus
    cordon = parse_cordon(f"  {gpu1.uuid.upper()} ,0", inv)  # case, spaces, order
    assert cordon.devices == {gpu0.uuid, gpu1.uuid, *(m.uuid for m in inv.mig_devices())}
    assert cordon.names == (f"0 ({gpu0.uuid})", f"1 ({gpu1.uuid})")
    assert cordon.problems == ()


def test_a_mig_device_alone() -> None:
    inv = inventory("sim:1xa100-40gb/mig=3g.20gb*2")
    one = inv.gpus[0].mig_devices[1]
    cordon = parse_cordon(one.uuid, inv)
    assert cordon.devices == {one.uuid}
    assert cordon.names == (f"0:1 ({one.uuid})",)


def test_entries_naming_nothing_are_skipped_with_the_annotation_and_entry_named() -> None:
    inv = inventory("sim:2xh100-80gb")
    cordon = parse_cordon("7,GPU-nope,1", inv)
    assert cordon.devices == {inv.gpus[1].uuid}
    assert len(cordon.problems) == 2
    assert cordon.problems[0].startswith("gpuslice.io/gpu-cordon: '7' is no GPU UUID")
    assert "GPU indices 0..1" in cordon.problems[0]
    assert "'GPU-nope'" in cordon.problems[1]


def test_empty_and_oversized_values() -> None:
    inv = inventory("sim:2xh100-80gb")
    assert parse_cordon("", inv).devices == frozenset()
    assert parse_cordon(" , ", inv).problems == ()
    long = "x" * 10_000
    (problem,) = parse_cordon(long, inv).problems
    assert len(problem) < 300  # the entry is shortened in the message
    many = parse_cordon(",".join(["bad"] * (MAX_ENTRIES + 50)) + ",0", inv)
    assert len(many.problems) == MAX_ENTRIES  # the rest is not read
    assert many.devices == frozenset()
