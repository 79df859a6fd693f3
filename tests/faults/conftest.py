"""The fault suite drives the real daemon with the e2e fixtures (`tests/e2e`)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "e2e"))
