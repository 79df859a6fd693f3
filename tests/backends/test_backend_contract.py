"""What every GpuBackend promises, checked on simulated nodes and (with --with-gpu) NVML."""

from __future__ import annotations

import re

from gpuslice.ports import GpuBackend

UUID_TAIL = r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"
BUS_ID = re.compile(r"^[0-9A-Fa-f]{8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-9A-Fa-f]$")


def test_name(backend: GpuBackend) -> None:
    assert backend.name in ("nvml", "simulated")


def test_inventory_is_well_formed(backend: GpuBackend) -> None:
    inv = backend.inventory()
    assert inv.gpus, "a node under test has at least one GPU"
    assert [g.index for g in inv.gpus] == list(range(len(inv.gpus)))
    uuids = [g.uuid for g in inv.gpus] + [m.uuid for m in inv.mig_devices()]
    assert len(set(uuids)) == len(uuids)
    assert re.fullmatch(r"\d+\.\d+(\.\d+)?", inv.driver_version)
    assert inv.cuda_driver_version >= 10000
    for gpu in inv.gpus:
        assert re.fullmatch("GPU-" + UUID_TAIL, gpu.uuid), gpu.uuid
        assert BUS_ID.match(gpu.pci_bus_id), gpu.pci_bus_id
        # 0 only where NVML reports no memory (a unified-memory GPU: GB10, Jetson Thor)
        assert gpu.memory_mib > 0 or not gpu.memory_reported
        assert gpu.multiprocessors > 0
        assert gpu.product_name
        assert gpu.compute_capability >= (7, 0)
        if gpu.mig_devices:
            assert gpu.mig_enabled
            assert gpu.mig_capable
        if gpu.mig_enabled:
            assert gpu.mig_capable
        assert len({m.index for m in gpu.mig_devices}) == len(gpu.mig_devices)
        assert len({(m.gi_id, m.ci_id) for m in gpu.mig_devices}) == len(gpu.mig_devices)
        used: set[int] = set()
        for mig in gpu.mig_devices:
            assert re.fullmatch("MIG-" + UUID_TAIL, mig.uuid), mig.uuid
            assert mig.parent_uuid == gpu.uuid
            assert mig.parent_index == gpu.index
            assert 0 < mig.memory_mib < gpu.memory_mib
            assert 0 < mig.multiprocessors < gpu.multiprocessors
            assert re.fullmatch(r"(\d+c\.)?\d+g\.\d+gb(\+me|\+me\.all|-me|\+gfx)?", mig.profile)
            if mig.placement_start >= 0:  # NVML may withhold placements without privileges
                span = set(range(mig.placement_start, mig.placement_start + mig.placement_size))
                assert not span & used, f"overlapping placements on GPU {gpu.index}"
                used |= span
        assert sum(m.memory_mib for m in gpu.mig_devices) <= gpu.memory_mib


def test_links_name_known_gpus_once(backend: GpuBackend) -> None:
    inv = backend.inventory()
    known = {g.uuid for g in inv.gpus}
    pairs = [frozenset((link.a, link.b)) for link in inv.links]
    assert len(set(pairs)) == len(pairs)
    for link in inv.links:
        assert {link.a, link.b} <= known
        assert link.a != link.b
        assert link.nvlinks >= 0


def test_statuses_cover_every_gpu(backend: GpuBackend) -> None:
    inv = backend.inventory()
    statuses = backend.statuses()
    assert sorted(s.gpu_uuid for s in statuses) == sorted(g.uuid for g in inv.gpus)
    for s in statuses:
        gpu = inv.gpu_by_uuid(s.gpu_uuid)
        assert gpu is not None
        if not gpu.memory_reported:  # unified memory: no figures, never made-up ones
            assert (s.memory_used_mib, s.memory_free_mib) == (None, None)
            continue
        assert s.memory_used_mib is not None
        assert s.memory_free_mib is not None
        assert s.memory_used_mib >= 0
        assert s.memory_free_mib >= 0
        assert s.memory_used_mib + s.memory_free_mib <= gpu.memory_mib
        if s.gpu_util_percent is not None:
            assert 0 <= s.gpu_util_percent <= 100


def test_processes_name_known_devices(backend: GpuBackend) -> None:
    inv = backend.inventory()
    for p in backend.processes():
        gpu = inv.gpu_by_uuid(p.gpu_uuid)
        assert gpu is not None
        if p.mig_uuid is not None:
            assert p.mig_uuid in {m.uuid for m in gpu.mig_devices}


def test_wait_health_event_times_out_with_none(backend: GpuBackend) -> None:
    assert backend.wait_health_event(0.2) is None
    assert backend.wait_health_event(0) is None


def test_close_is_idempotent(backend: GpuBackend) -> None:
    backend.close()
    backend.close()
    assert backend.wait_health_event(0.1) is None
