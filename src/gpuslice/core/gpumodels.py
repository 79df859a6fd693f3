"""Facts about real GPU models, as NVML reports them, for the simulated backend and for
`gpuslice advise` (pure data, hence in the core: advise sizes MIG layouts and reads a
model's memory from the same tables the simulator places and reports them with).

The simulator is only useful if the numbers it reports are the ones a real node reports:
the product name feeds the `nvidia.com/gpu.product` label, memory feeds the labels and the
MPS limits, and the MIG tables decide which layouts a user can ask for.

Sources (gpuslice's REFERENCE.md, which cites each):
- product names, memory MiB, SM counts: `nvidia-smi` / NVML output on the hardware
  (`Tesla T4` 15360 MiB, `NVIDIA H100 80GB HBM3` 81559 MiB, `NVIDIA H200` 143771 MiB, ...);
  SM counts are the full-chip counts of each SKU (T4 40, A100 108, H100 SXM5 132, L40S 142).
- PCI device IDs: mig-parted's device filters (`0x20B010DE` A100-SXM4-40GB, `0x20B510DE`
  A100 80GB PCIe, `0x233010DE` H100 80GB HBM3, `0x233510DE` H200 141GB) and the PCI ID
  database for the non-MIG parts.
- MIG profile tables: the MIG User Guide (v580) tables for A100, H100, H200 and A30 (engines,
  max instances, fractions), its placement listing (`nvidia-smi mig -lgipp`), and memory and
  SM counts from `nvidia-smi mig -lgip` on real systems (A100 80GB `1g.10gb` = 9.50 GiB =
  9728 MiB with 14 SMs, as in the seed user document).
- GB10 (DGX Spark): `nvidia-smi` on the hardware shows `NVIDIA GB10` and "Not Supported"
  for its memory (NVIDIA/k8s-device-plugin#1482, NVIDIA's DGX Spark known issues): CPU and
  GPU share one LPDDR5X memory, so NVML's memory query answers NOT_SUPPORTED; 6144 CUDA
  cores (48 SMs), compute capability 12.1.
- H200: every profile's memory, SMs, engines, instance count and placements as NVML's
  profile and placement queries answer them on an H200 (MIG mode off; read through ctypes
  with `nvmlDeviceGetGpuInstanceProfileInfoV` and `...PossiblePlacements_v2`): `1g.35gb`
  33280 MiB and 26 SMs, `3g.71gb` and `4g.71gb` 71424 MiB (60 and 64 SMs), which were
  estimates before.
- Estimates: all A30 memory values (go-nvml's mock; not confirmed on hardware).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from gpuslice.core.devices import PCI_CLASS_3D, PCI_CLASS_VGA, GpuUuid, MigDevice, MigUuid
from gpuslice.core.migcaps import numbered_minors

Architecture = Literal["turing", "ampere", "ada-lovelace", "hopper", "blackwell"]


@dataclass(frozen=True, slots=True)
class MigProfile:
    """One GPU instance profile, with a single compute instance spanning it."""

    name: str
    """Canonical name, e.g. `1g.10gb` or `1g.10gb+me`."""
    compute_slices: int
    memory_slices: int
    """Placement size in memory slices."""
    memory_mib: int
    multiprocessors: int
    max_instances: int
    starts: tuple[int, ...]
    """Placement starts, in memory slices (`nvidia-smi mig -lgipp`)."""
    copy_engines: int
    decoders: int
    jpeg: int
    ofa: int
    encoders: int = 0
    profile_id: int | None = None
    """NVML's GPU instance profile ID (`nvidia-smi mig -lgip`): what creating an instance
    takes and what NVIDIA's device names carry. It is the model's, not the shape's (an A30's
    `2g.12gb` is 5 where an 8-slice GPU's `2g` is 14), so the tables give it per model; None
    only where a backend could not read it (names then fall back to the shape table,
    `core.dra.publish.GI_PROFILE_IDS`)."""

    @property
    def media_extensions(self) -> bool:
        """`+me` profiles take the GPU's single OFA/JPEG unit: at most one per GPU."""
        return self.name.endswith("+me")

    def device(
        self,
        *,
        uuid: str,
        parent_uuid: GpuUuid,
        parent_index: int,
        parent_minor: int,
        index: int,
        gi_id: int,
        ci_id: int,
        start: int,
    ) -> MigDevice:
        """The MIG device an instance of this profile at `start` is (one compute instance
        spanning it), as the simulator's layouts, its created instances and `describe
        --claims`' would-be devices all describe it; capability minors in the driver's
        fixed numbering from the parent's minor."""
        return MigDevice(
            uuid=MigUuid(uuid),
            parent_uuid=parent_uuid,
            parent_index=parent_index,
            index=index,
            profile=self.name,
            gi_id=gi_id,
            ci_id=ci_id,
            memory_mib=self.memory_mib,
            multiprocessors=self.multiprocessors,
            slices_gi=self.compute_slices,
            slices_ci=self.compute_slices,
            placement_start=start,
            placement_size=self.memory_slices,
            engines_copy=self.copy_engines,
            engines_decoder=self.decoders,
            engines_encoder=self.encoders,
            engines_jpeg=self.jpeg,
            engines_ofa=self.ofa,
            cap_minors=numbered_minors(parent_minor, gi_id, ci_id),
        )


@dataclass(frozen=True, slots=True)
class MigGeometry:
    """How a MIG-capable GPU divides: slice counts and the profiles it offers."""

    memory_slices: int
    compute_slices: int
    profiles: tuple[MigProfile, ...]

    def profile(self, name: str) -> MigProfile | None:
        for p in self.profiles:
            if p.name == name:
                return p
        return None


@dataclass(frozen=True, slots=True)
class GpuModel:
    key: str
    """Spec name, e.g. `a100-40gb`."""
    product_name: str
    memory_mib: int
    multiprocessors: int
    compute_capability: tuple[int, int]
    pci_device_id: int
    architecture: Architecture
    nvlinks: int = 0
    """NVLinks per GPU on the SXM baseboard; 0 for PCIe cards."""
    mig: MigGeometry | None = None
    pci_class: int = PCI_CLASS_3D
    """`lspci` says "3D controller" for data-centre cards, "VGA compatible controller" for
    GeForce cards with display outputs."""
    unified_memory: bool = False
    """CPU and GPU share one memory (GB10 / DGX Spark, Jetson Thor): NVML's memory info
    answers NOT_SUPPORTED there, so the simulator reports no memory figures for it (its
    `memory_mib` is 0, as the NVML backend reports such a GPU)."""

    @property
    def mig_capable(self) -> bool:
        return self.mig is not None


def _p(
    name: str,
    pid: int,
    sms: int,
    mib: int,
    max_instances: int,
    placement: tuple[tuple[int, ...], int],
    engines: tuple[int, int, int, int],
) -> MigProfile:
    """Table row: `pid` is NVML's profile ID, engines are (copy, decoder, jpeg, ofa);
    placement is (starts, size)."""
    starts, size = placement
    copy, dec, jpeg, ofa = engines
    return MigProfile(
        name=name,
        compute_slices=int(name.split("g.", 1)[0]),
        memory_slices=size,
        memory_mib=mib,
        multiprocessors=sms,
        max_instances=max_instances,
        starts=starts,
        copy_engines=copy,
        decoders=dec,
        jpeg=jpeg,
        ofa=ofa,
        profile_id=pid,
    )


_ONE = ((0, 1, 2, 3, 4, 5, 6), 1)
_ONE_WIDE = ((0, 2, 4, 6), 2)
_TWO = ((0, 2, 4), 2)
_THREE = ((0, 4), 4)
_FOUR = ((0,), 4)
_SEVEN = ((0,), 8)


def _ampere_8slice(mem_gb: int, mib: tuple[int, int, int, int]) -> MigGeometry:
    """A100 40GB and 80GB share fractions and engines; only memory (and names) differ."""
    small, wide, half, full = mib
    g = mem_gb // 8
    return MigGeometry(
        memory_slices=8,
        compute_slices=7,
        profiles=(
            _p(f"1g.{g}gb", 19, 14, small, 7, _ONE, (1, 0, 0, 0)),
            _p(f"1g.{g}gb+me", 20, 14, small, 1, _ONE, (1, 1, 1, 1)),
            _p(f"1g.{2 * g}gb", 15, 14, wide, 4, _ONE_WIDE, (1, 1, 0, 0)),
            _p(f"2g.{2 * g}gb", 14, 28, wide, 3, _TWO, (2, 1, 0, 0)),
            _p(f"3g.{4 * g}gb", 9, 42, half, 2, _THREE, (3, 2, 0, 0)),
            _p(f"4g.{4 * g}gb", 5, 56, half, 1, _FOUR, (4, 2, 0, 0)),
            _p(f"7g.{mem_gb}gb", 0, 98, full, 1, _SEVEN, (7, 5, 1, 1)),
        ),
    )


def _hopper_8slice(names: tuple[str, str, str, str], mib: tuple[int, int, int, int]) -> MigGeometry:
    """H100 and H200 share fractions, engines and SM counts (same GH100 die)."""
    small, wide, half, full = names
    m_small, m_wide, m_half, m_full = mib
    return MigGeometry(
        memory_slices=8,
        compute_slices=7,
        profiles=(
            _p(f"1g.{small}", 19, 16, m_small, 7, _ONE, (1, 1, 1, 0)),
            _p(f"1g.{small}+me", 20, 16, m_small, 1, _ONE, (1, 1, 1, 1)),
            _p(f"1g.{wide}", 15, 26, m_wide, 4, _ONE_WIDE, (1, 1, 1, 0)),
            _p(f"2g.{wide}", 14, 32, m_wide, 3, _TWO, (2, 2, 2, 0)),
            _p(f"3g.{half}", 9, 60, m_half, 2, _THREE, (3, 3, 3, 0)),
            _p(f"4g.{half}", 5, 64, m_half, 1, _FOUR, (4, 4, 4, 0)),
            _p(f"7g.{full}", 0, 132, m_full, 1, _SEVEN, (8, 7, 7, 1)),
        ),
    )


A100_40GB_MIG = _ampere_8slice(40, (4864, 9856, 20096, 40448))
A100_80GB_MIG = _ampere_8slice(80, (9728, 19968, 40192, 80896))
H100_80GB_MIG = _hopper_8slice(("10gb", "20gb", "40gb", "80gb"), (9984, 20096, 40448, 81152))
H200_MIG = _hopper_8slice(
    ("18gb", "35gb", "71gb", "141gb"),
    (16384, 33280, 71424, 143360),
)
A30_MIG = MigGeometry(
    memory_slices=4,
    compute_slices=4,
    profiles=(
        _p("1g.6gb", 14, 14, 5836, 4, ((0, 1, 2, 3), 1), (1, 0, 0, 0)),
        _p("1g.6gb+me", 21, 14, 5836, 1, ((0, 1, 2, 3), 1), (1, 1, 1, 1)),
        _p("2g.12gb", 5, 28, 11672, 2, ((0, 2), 2), (2, 2, 0, 0)),
        _p("2g.12gb+me", 6, 28, 11672, 1, ((0, 2), 2), (2, 2, 1, 1)),
        _p("4g.24gb", 0, 56, 23344, 1, ((0,), 4), (4, 4, 1, 1)),
    ),
)

MODELS: dict[str, GpuModel] = {
    m.key: m
    for m in (
        GpuModel("t4", "Tesla T4", 15360, 40, (7, 5), 0x1EB810DE, "turing"),
        GpuModel(
            "rtx-3060",
            "NVIDIA GeForce RTX 3060",
            12288,
            28,
            (8, 6),
            0x250310DE,
            "ampere",
            pci_class=PCI_CLASS_VGA,
        ),
        GpuModel("l40s", "NVIDIA L40S", 46068, 142, (8, 9), 0x26B910DE, "ada-lovelace"),
        GpuModel(
            "a100-40gb",
            "NVIDIA A100-SXM4-40GB",
            40960,
            108,
            (8, 0),
            0x20B010DE,
            "ampere",
            nvlinks=12,
            mig=A100_40GB_MIG,
        ),
        GpuModel(
            "a100-80gb",
            "NVIDIA A100 80GB PCIe",
            81920,
            108,
            (8, 0),
            0x20B510DE,
            "ampere",
            mig=A100_80GB_MIG,
        ),
        GpuModel("a30", "NVIDIA A30", 24576, 56, (8, 0), 0x20B710DE, "ampere", mig=A30_MIG),
        GpuModel(
            "h100-80gb",
            "NVIDIA H100 80GB HBM3",
            81559,
            132,
            (9, 0),
            0x233010DE,
            "hopper",
            nvlinks=18,
            mig=H100_80GB_MIG,
        ),
        GpuModel(
            "h200",
            "NVIDIA H200",
            143771,
            132,
            (9, 0),
            0x233510DE,
            "hopper",
            nvlinks=18,
            mig=H200_MIG,
        ),
        # DGX Spark: a unified-memory SoC, no memory figure (see the module docstring).
        # Estimates: the PCI device ID (0x2E12, the PCI ID database) and the VGA class (it
        # drives the box's display outputs) are not confirmed on hardware.
        GpuModel(
            "gb10",
            "NVIDIA GB10",
            0,
            48,
            (12, 1),
            0x2E1210DE,
            "blackwell",
            pci_class=PCI_CLASS_VGA,
            unified_memory=True,
        ),
    )
}
"""Every simulated model by spec name."""


def known_models() -> str:
    """For error messages: the spec names a user can pick from."""
    return ", ".join(sorted(MODELS))
