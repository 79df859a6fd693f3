"""MIG facts from NVIDIA's MIG User Guide tables and mig-parted's `all-*` configs,
written out by hand (not read from the simulator) so a wrong simulator table fails."""

from __future__ import annotations

# Maximum GPU instances of each profile on one GPU.
MAX_INSTANCES: dict[str, dict[str, int]] = {
    "a100-40gb": {
        "1g.5gb": 7,
        "1g.5gb+me": 1,
        "1g.10gb": 4,
        "2g.10gb": 3,
        "3g.20gb": 2,
        "4g.20gb": 1,
        "7g.40gb": 1,
    },
    "a100-80gb": {
        "1g.10gb": 7,
        "1g.10gb+me": 1,
        "1g.20gb": 4,
        "2g.20gb": 3,
        "3g.40gb": 2,
        "4g.40gb": 1,
        "7g.80gb": 1,
    },
    "a30": {"1g.6gb": 4, "1g.6gb+me": 1, "2g.12gb": 2, "2g.12gb+me": 1, "4g.24gb": 1},
    "h100-80gb": {
        "1g.10gb": 7,
        "1g.10gb+me": 1,
        "1g.20gb": 4,
        "2g.20gb": 3,
        "3g.40gb": 2,
        "4g.40gb": 1,
        "7g.80gb": 1,
    },
    "h200": {
        "1g.18gb": 7,
        "1g.18gb+me": 1,
        "1g.35gb": 4,
        "2g.35gb": 3,
        "3g.71gb": 2,
        "4g.71gb": 1,
        "7g.141gb": 1,
    },
}


# NVIDIA's MIG User Guide, "Supported MIG Profiles" (one table per GPU: fraction of memory and
# of SMs, NVDEC / JPEG / OFA units, copy engines, number of instances), with the profile IDs
# `nvidia-smi mig -lgip` prints and the placements `nvidia-smi mig -lgipp` prints on each.
# Row: (profile, profile ID, compute slices (SM fraction's numerator), memory slices (memory
# fraction's numerator), copy engines, NVDECs, JPEGs, OFAs, instances, placement starts).
Row = tuple[str, int, int, int, int, int, int, int, int, tuple[int, ...]]
_ONE = (0, 1, 2, 3, 4, 5, 6)


def _ampere(small: str, wide: str, half: str, full: str) -> list[Row]:
    """A100 40GB and 80GB: one table, the names follow the memory (the guide's note)."""
    return [
        (f"1g.{small}", 19, 1, 1, 1, 0, 0, 0, 7, _ONE),
        (f"1g.{small}+me", 20, 1, 1, 1, 1, 1, 1, 1, _ONE),
        (f"1g.{wide}", 15, 1, 2, 1, 1, 0, 0, 4, (0, 2, 4, 6)),
        (f"2g.{wide}", 14, 2, 2, 2, 1, 0, 0, 3, (0, 2, 4)),
        (f"3g.{half}", 9, 3, 4, 3, 2, 0, 0, 2, (0, 4)),
        (f"4g.{half}", 5, 4, 4, 4, 2, 0, 0, 1, (0,)),
        (f"7g.{full}", 0, 7, 8, 7, 5, 1, 1, 1, (0,)),
    ]


def _hopper(small: str, wide: str, half: str, full: str) -> list[Row]:
    """H100 and H200: one table, the names follow the memory."""
    return [
        (f"1g.{small}", 19, 1, 1, 1, 1, 1, 0, 7, _ONE),
        (f"1g.{small}+me", 20, 1, 1, 1, 1, 1, 1, 1, _ONE),
        (f"1g.{wide}", 15, 1, 2, 1, 1, 1, 0, 4, (0, 2, 4, 6)),
        (f"2g.{wide}", 14, 2, 2, 2, 2, 2, 0, 3, (0, 2, 4)),
        (f"3g.{half}", 9, 3, 4, 3, 3, 3, 0, 2, (0, 4)),
        (f"4g.{half}", 5, 4, 4, 4, 4, 4, 0, 1, (0,)),
        (f"7g.{full}", 0, 7, 8, 8, 7, 7, 1, 1, (0,)),
    ]


NVIDIA_TABLES: dict[str, list[Row]] = {
    "a100-40gb": _ampere("5gb", "10gb", "20gb", "40gb"),
    "a100-80gb": _ampere("10gb", "20gb", "40gb", "80gb"),
    "a30": [
        ("1g.6gb", 14, 1, 1, 1, 0, 0, 0, 4, (0, 1, 2, 3)),
        ("1g.6gb+me", 21, 1, 1, 1, 1, 1, 1, 1, (0, 1, 2, 3)),
        ("2g.12gb", 5, 2, 2, 2, 2, 0, 0, 2, (0, 2)),
        ("2g.12gb+me", 6, 2, 2, 2, 2, 1, 1, 1, (0, 2)),
        ("4g.24gb", 0, 4, 4, 4, 4, 1, 1, 1, (0,)),
    ],
    "h100-80gb": _hopper("10gb", "20gb", "40gb", "80gb"),
    "h200": _hopper("18gb", "35gb", "71gb", "141gb"),
}
"""Every MIG model the simulator has, as NVIDIA's tables give it."""
