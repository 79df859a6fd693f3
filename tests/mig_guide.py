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
