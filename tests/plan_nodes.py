"""Inventories for plan tests, built from the device dataclasses with real GPUs' numbers.

Kept independent of the simulated backend so plan tests only depend on the core.
"""

from __future__ import annotations

from pathlib import Path

from gpuslice.core.config import Config, parse_config
from gpuslice.core.devices import Gpu, GpuUuid, Inventory, MigDevice, MigUuid

SEEDS = Path(__file__).parent / "configs" / "seeds"


def seed(name: str) -> Config:
    path = SEEDS / name
    return parse_config(path.read_text(encoding="utf-8"), source=path.name)


def gpu_uuid(model: int, index: int) -> GpuUuid:
    return GpuUuid(f"GPU-{model:08x}-{index:04x}-4000-8000-000000000000")


def mig_uuid(model: int, gpu: int, mig: int) -> MigUuid:
    return MigUuid(f"MIG-{model:08x}-{gpu:04x}-4000-8000-{mig:012x}")


def _gpu(model: int, index: int, name: str, mib: int, sms: int, cc: tuple[int, int]) -> Gpu:
    return Gpu(
        index=index,
        uuid=gpu_uuid(model, index),
        product_name=name,
        memory_mib=mib,
        multiprocessors=sms,
        compute_capability=cc,
        pci_bus_id=f"00000000:{index + 0x17:02X}:00.0",
        minor=index,
        numa_node=0,
    )


def t4(index: int) -> Gpu:
    return _gpu(0x7447, index, "Tesla T4", 15360, 40, (7, 5))


def l40s(index: int) -> Gpu:
    return _gpu(0x1405, index, "NVIDIA L40S", 46068, 142, (8, 9))


def v100(index: int) -> Gpu:
    return _gpu(0x7100, index, "Tesla V100-SXM2-16GB", 16160, 80, (7, 0))


def a100_80(index: int, migs: list[tuple[str, int, int]] | None = None) -> Gpu:
    """A100 80GB PCIe; `migs` = [(profile, MiB, SMs)] makes it MIG-enabled with those devices."""
    return _with_migs(_gpu(0xA180, index, "NVIDIA A100 80GB PCIe", 81920, 108, (8, 0)), migs)


def a100_40(index: int, migs: list[tuple[str, int, int]] | None = None) -> Gpu:
    return _with_migs(_gpu(0xA140, index, "NVIDIA A100-SXM4-40GB", 40960, 108, (8, 0)), migs)


def _with_migs(gpu: Gpu, migs: list[tuple[str, int, int]] | None) -> Gpu:
    if migs is None:
        return gpu
    model = int(gpu.uuid[4:12], 16)
    devices = tuple(
        MigDevice(
            uuid=mig_uuid(model, gpu.index, j),
            parent_uuid=gpu.uuid,
            parent_index=gpu.index,
            index=j,
            profile=profile,
            gi_id=j + 1,
            ci_id=0,
            memory_mib=mib,
            multiprocessors=sms,
            slices_gi=int(profile.split("g.")[0].split(".")[-1]),
            slices_ci=int(profile.split("g.")[0].split(".")[-1]),
            placement_start=j,
            placement_size=1,
        )
        for j, (profile, mib, sms) in enumerate(migs)
    )
    return Gpu(
        index=gpu.index,
        uuid=gpu.uuid,
        product_name=gpu.product_name,
        memory_mib=gpu.memory_mib,
        multiprocessors=gpu.multiprocessors,
        compute_capability=gpu.compute_capability,
        pci_bus_id=gpu.pci_bus_id,
        minor=gpu.minor,
        numa_node=gpu.numa_node,
        mig_capable=True,
        mig_enabled=True,
        mig_pending=True,
        mig_devices=devices,
    )


ONE_G_10GB = ("1g.10gb", 9728, 14)
"""A100 80GB: 9.50 GiB, 14 SMs (seed 001's `nvidia-smi mig -lgip`)."""


def node(*gpus: Gpu) -> Inventory:
    return Inventory(gpus=tuple(gpus), driver_version="550.54.15", cuda_driver_version=12040)
