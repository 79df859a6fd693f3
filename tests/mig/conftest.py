"""MIG tests reuse the real-daemon harness of tests/e2e and the seed configs of tests/configs.

`daemon_fixtures` lives next to the e2e tests and is imported by module name there (pytest's
default import mode puts each test folder on sys.path); these tests need the same harness, so
its folder is put on the path here rather than copying it.
"""

from __future__ import annotations

import sys
from pathlib import Path

E2E = Path(__file__).resolve().parent.parent / "e2e"
if str(E2E) not in sys.path:
    sys.path.insert(0, str(E2E))
