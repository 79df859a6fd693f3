"""`advise --write-claims`: the MIG advice as ResourceClaimTemplates, one per profile, for
GPUs in dynamic MIG (`core.dra.partitions`): there a claim asks for a profile and the
scheduler picks the GPU and the placement, so the advice needs no layout and no drain.

Each template asks the `mig.nvidia.com` class for one device of the profile on the model
(its product name, as the simulator's tables and NVML spell it). Only profiles some pod
fits get a template; the pods each one suits are listed with it, for the writer's comments.
The product name is one of gpuslice's own tables (a MIG plan exists only for a known model),
so nothing read from Prometheus reaches the CEL expression.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuslice.core.advise.advice import Advice
from gpuslice.core.gpumodels import MODELS

MIG_CLASS = "mig.nvidia.com"


@dataclass(frozen=True, slots=True)
class ClaimTemplate:
    name: str
    model: str
    profile: str
    pods: tuple[str, ...]
    """`<pod>/<container>` of the pods this profile suits."""
    doc: dict[str, object]


def template_name(key: str, profile: str) -> str:
    spelled = "".join(c for c in profile.lower().replace("+", "-") if c.isalnum() or c == "-")
    return f"mig-{key}-{spelled}"


def mig_claim_templates(
    advice: Advice, driver: str = "gpu.nvidia.com"
) -> tuple[ClaimTemplate, ...]:
    out: list[ClaimTemplate] = []
    for m in advice.models:
        if m.mig is None or not any(p.product_name == m.model for p in MODELS.values()):
            continue
        suits: dict[str, list[str]] = {}
        for fit in m.mig.fits:
            if fit.profile is not None:
                suits.setdefault(fit.profile, []).append(f"{fit.pod}/{fit.container}")
        for profile, pods in sorted(suits.items()):
            expression = (
                f"device.attributes['{driver}'].profile == '{profile}' && "
                f"device.attributes['{driver}'].productName == '{m.model}'"
            )
            name = template_name(m.key, profile)
            doc: dict[str, object] = {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceClaimTemplate",
                "metadata": {"name": name},
                "spec": {
                    "spec": {
                        "devices": {
                            "requests": [
                                {
                                    "name": "mig",
                                    "exactly": {
                                        "deviceClassName": MIG_CLASS,
                                        "selectors": [{"cel": {"expression": expression}}],
                                    },
                                }
                            ]
                        }
                    }
                },
            }
            out.append(ClaimTemplate(name, m.model, profile, tuple(pods), doc))
    return tuple(out)
