"""Which named config a node runs: NVIDIA config-manager's rules, as a pure function.

Users label nodes (`nvidia.com/device-plugin.config=a100`) and keep one ConfigMap of named
configs; the order of precedence (label, then default, then fallbacks) and the error
wording follow NVIDIA's config-manager so existing runbooks still apply. Two deliberate
differences, both about reporting:

* every error names the node label (and the configs that do exist), so the Event posted
  on the node says what to fix;
* a missing default config is named in the message (NVIDIA prints an empty name there),
  and an unknown fallback strategy is reported even when an earlier step succeeded, so a
  typo in FALLBACK_STRATEGIES is caught at the first selection, not when a node loses its
  label.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from gpuslice.core.errors import ConfigError, FieldProblem

DEFAULT_NODE_LABEL = "nvidia.com/device-plugin.config"
NAMED_DEFAULT = "default"
"""The file the `named` fallback looks for."""

Fallback = Literal["named", "single", "empty"]
FALLBACKS: tuple[Fallback, ...] = ("named", "single", "empty")

SelectedBy = Literal["label", "default", "named", "single", "empty"]


@dataclass(frozen=True, slots=True)
class Selection:
    name: str | None
    """The named config to use; None means the empty config (every default)."""
    by: SelectedBy
    """Which rule chose it, for logs and Events."""

    @property
    def empty(self) -> bool:
        return self.name is None


def usable_names(available: Sequence[str]) -> list[str]:
    """Names that count as configs: `..`-prefixed entries are the kubelet's ConfigMap
    volume internals (`..data`, `..2024_06_11...`), never user configs."""
    return sorted({n for n in available if n and not n.startswith("..")})


def check_fallbacks(fallbacks: Sequence[str], *, source: str = "FALLBACK_STRATEGIES") -> None:
    """Reject unknown fallback strategies up front, naming the accepted ones."""
    unknown = [f for f in fallbacks if f not in FALLBACKS]
    if unknown:
        accepted = ", ".join(FALLBACKS)
        raise ConfigError(
            [
                FieldProblem(source, f"unknown fallback strategy: {u} (accepted: {accepted})")
                for u in unknown
            ]
        )


def select_config(
    available: Sequence[str],
    label_value: str,
    default: str,
    fallbacks: Sequence[str],
    *,
    label: str = DEFAULT_NODE_LABEL,
) -> Selection:
    """Choose the config for this node, or raise ConfigError saying why none fits."""
    check_fallbacks(fallbacks)
    names = usable_names(available)
    known = ", ".join(names)
    if not names:
        raise _error(label, label_value, "no configuration files available")
    if label_value:
        if label_value not in names:
            raise _error(
                label, label_value, f"specified config {label_value} does not exist ({known})"
            )
        return Selection(label_value, "label")
    if default:
        if default not in names:
            raise _error(
                label,
                label_value,
                f"specified config {default} does not exist (the default config; {known})",
            )
        return Selection(default, "default")
    for fallback in fallbacks:
        if fallback == "named" and NAMED_DEFAULT in names:
            return Selection(NAMED_DEFAULT, "named")
        if fallback == "single" and len(names) == 1:
            return Selection(names[0], "single")
        if fallback == "empty":
            return Selection(None, "empty")
    tried = ", ".join(fallbacks) or "none"
    raise _error(
        label,
        label_value,
        "no config was set, no default was provided, and all fallbacks failed "
        f"(fallbacks tried: {tried}; configs: {known})",
    )


def _error(label: str, value: str, message: str) -> ConfigError:
    where = f"node label {label}={value}" if value else f"node label {label} (unset)"
    return ConfigError([FieldProblem(where, message)])
