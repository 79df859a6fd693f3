"""Choosing and loading the config the node should run, and noticing when that changes.

The choice follows NVIDIA's config-manager (label value, then default, then fallbacks); the
file reading is `host.configfiles`; parsing and validation are the core's. A config that
fails validation is returned as an error, never applied: the caller keeps the plan in force.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuslice.agent.settings import AgentSettings
from gpuslice.core.config import Config, apply_overrides, parse_config
from gpuslice.core.config.selection import select_config, usable_names
from gpuslice.core.errors import ConfigError, FieldProblem
from gpuslice.host.configfiles import NamedConfigs, fingerprint, read_configs


@dataclass(frozen=True, slots=True)
class LoadedConfig:
    name: str
    """The named config chosen (`""` for a lone file or the empty config)."""
    config: Config
    fingerprint: tuple[tuple[str, int, int], ...]


def choose(named: NamedConfigs, *, pinned: str, label_value: str, settings: AgentSettings) -> str:
    """The name to use from a set of named configs, or `""` for the empty config."""
    if named.single_file:
        return ""
    if pinned:
        # a pinned name (--config-name / CONFIG_NAME) is not the node label's doing: say so
        names = usable_names(list(named.texts))
        if pinned not in names:
            raise ConfigError(
                [
                    FieldProblem(
                        "--config-name / CONFIG_NAME",
                        f"config {pinned} does not exist in {named.source} "
                        f"(configs: {', '.join(names) or 'none'})",
                    )
                ]
            )
        return pinned
    wanted = label_value
    default = settings.default_config or named.default
    selection = select_config(
        list(named.texts),
        wanted,
        default,
        list(settings.fallback_strategies),
        label=settings.node_label,
    )
    return selection.name or ""


def load_config(settings: AgentSettings, label_value: str = "") -> LoadedConfig:
    """Read, choose, parse and override. Raises ConfigError (core) with every problem."""
    if settings.config_path is None:
        if settings.config_name:
            raise ConfigError(
                [
                    FieldProblem(
                        "--config-name / CONFIG_NAME",
                        f"{settings.config_name!r} names a config, but no --config-file "
                        "(a ConfigMap, directory or Helm values of named configs) was given",
                    )
                ]
            )
        config = apply_overrides(parse_config("", source="<defaults>"), settings.overrides)
        return LoadedConfig(name="", config=config, fingerprint=())
    named = read_configs(settings.config_path)
    name = choose(named, pinned=settings.config_name, label_value=label_value, settings=settings)
    text = named.texts.get(name, "")
    source = f"{named.source}:{name}" if name else named.source
    config = apply_overrides(parse_config(text, source=source), settings.overrides)
    return LoadedConfig(name=name, config=config, fingerprint=named.fingerprint)


def current_fingerprint(settings: AgentSettings) -> tuple[tuple[str, int, int], ...]:
    if settings.config_path is None:
        return ()
    try:
        return fingerprint(settings.config_path)
    except OSError:  # a ConfigMap volume mid-update (symlink swap): retried next tick
        return ()
