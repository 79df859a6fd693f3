"""The memory guard's e2e setting: its config, and a process to stand in for a pod's workload."""

from __future__ import annotations

import subprocess
import sys

WAIT_S = 15.0
NODE = "gpu-node-1"
CONFIG = """\
version: v1
sharing:
  timeSlicing:
    resources:
    - name: nvidia.com/gpu
      replicas: 4
"""


def sleeper() -> subprocess.Popen[bytes]:
    """A real process standing in for a pod's CUDA process (the default SIGTERM action ends
    it, so its return code says which signal the guard sent)."""
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
