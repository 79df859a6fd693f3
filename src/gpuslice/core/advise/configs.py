"""`advise --write-config`: the plan as users already keep configs, one named NVIDIA
config v1 per GPU model in a ConfigMap, selected per node by the label
`nvidia.com/device-plugin.config=<name>`.

Time-slicing is what is written: it is what the `replicas` users guess today are, and
the plan the replay checked. Named after the model (`h100-80gb`), not the count, so that
advising again updates the config a node already selects instead of asking for relabels.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuslice.core.advise.advice import Advice
from gpuslice.core.config.selection import DEFAULT_NODE_LABEL


@dataclass(frozen=True, slots=True)
class NamedConfig:
    name: str
    model: str
    replicas: int
    config: dict[str, object]

    @property
    def label(self) -> str:
        return f"{DEFAULT_NODE_LABEL}={self.name}"


def named_configs(advice: Advice) -> tuple[NamedConfig, ...]:
    """One per model that has a time-slicing recommendation (idle models have none)."""
    out = []
    for m in advice.models:
        if m.time_slicing is None:
            continue
        config: dict[str, object] = {
            "version": "v1",
            "flags": {"migStrategy": "none"},
            "sharing": {
                "timeSlicing": {
                    "resources": [{"name": "nvidia.com/gpu", "replicas": m.time_slicing.replicas}]
                }
            },
        }
        out.append(NamedConfig(m.key, m.model, m.time_slicing.replicas, config))
    return tuple(out)
