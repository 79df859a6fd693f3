"""Every config users have today (the seed documents) loads unchanged, with the values the
documents describe, and survives a dump and reload (`describe -o yaml` output is loadable)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from gpuslice.core.config import Config, parse_config

SEEDS = Path(__file__).parents[2] / "configs" / "seeds"


def _entries(path: Path) -> dict[str, str]:
    """Named config texts in a file: a ConfigMap's `data`, Helm's `config.map`, or the file."""
    text = path.read_text(encoding="utf-8")
    doc = yaml.safe_load(text)
    if isinstance(doc, dict) and doc.get("kind") == "ConfigMap":
        return {str(k): v or "" for k, v in doc["data"].items()}
    if isinstance(doc, dict) and isinstance(doc.get("config"), dict):
        return {str(k): v or "" for k, v in doc["config"]["map"].items()}
    return {"": text}


ALL = [
    pytest.param(path, name, text, id=f"{path.stem}:{name}" if name else path.stem)
    for path in sorted(SEEDS.glob("*.yaml"))
    for name, text in _entries(path).items()
]


def load(name: str, entry: str = "") -> Config:
    return parse_config(_entries(SEEDS / name)[entry], source=name)


@pytest.mark.parametrize(("path", "name", "text"), ALL)
def test_every_seed_config_loads_and_round_trips(path: Path, name: str, text: str) -> None:
    config = parse_config(text, source=f"{path.name}:{name}")
    dumped = yaml.safe_dump(config.model_dump(by_alias=True))
    assert parse_config(dumped, source="dump") == config


def test_seed_fixture_set_covers_every_document() -> None:
    prefixes = {p.name[:3] for p in SEEDS.glob("*.yaml")}
    assert prefixes == {"000", "001", "002", "003", "004"}
    assert len(ALL) >= 25


def test_helm_empty_default_entry_is_the_all_defaults_config() -> None:
    entries = _entries(SEEDS / "001-helm-values-time-slicing.yaml")
    assert entries["default"] == ""
    assert parse_config(entries["default"]) == Config()
    assert load("001-helm-values-time-slicing.yaml", "ls40") == load(
        "001-ls40-time-slicing-10.yaml"
    )


def test_seed_000_time_slicing_four_replicas() -> None:
    config = load("000-configmap-time-slicing-config.yaml", "default")
    ts = config.sharing.time_slicing
    assert ts is not None
    assert [(r.name, r.replicas, r.devices) for r in ts.resources] == [("nvidia.com/gpu", 4, "all")]
    assert ts.fail_requests_greater_than_one is False
    assert ts.rename_by_default is False
    assert config.sharing.mps is None


def test_seed_001_ls40_time_slicing_fails_multi_requests() -> None:
    ts = load("001-ls40-time-slicing-10.yaml").sharing.time_slicing
    assert ts is not None
    assert ts.fail_requests_greater_than_one is True
    assert ts.resources[0].replicas == 10


def test_seed_001_mps_defaults_fail_requests_to_true() -> None:
    config = load("001-helm-values-mps.yaml", "ls40")
    assert config.sharing.mps is not None
    assert config.sharing.mps.fail_requests_greater_than_one is True
    assert config.sharing.time_slicing is None
    assert config.flags.mps_root == ""
    assert config.flags.effective_mps_root == "/run/nvidia/mps"


def test_seed_001_multi_map_entries() -> None:
    ls40 = load("001-helm-values-multi.yaml", "ls40")
    a100 = load("001-helm-values-multi.yaml", "a100")
    assert ls40.sharing.time_slicing is not None
    assert ls40.sharing.time_slicing.resources[0].replicas == 6
    assert a100.sharing.mps is not None
    assert a100.sharing.mps.resources[0].replicas == 10


def test_seed_001_mig_single() -> None:
    assert load("001-helm-values-mig-single.yaml", "a100").flags.mig_strategy == "single"


def test_seed_002_fine_config_map() -> None:
    a100 = load("002-configmap-time-slicing-config-fine.yaml", "a100-40gb")
    assert a100.flags.mig_strategy == "mixed"
    assert a100.sharing.time_slicing is not None
    assert {r.name: r.replicas for r in a100.sharing.time_slicing.resources} == {
        "nvidia.com/gpu": 8,
        "nvidia.com/mig-1g.5gb": 2,
        "nvidia.com/mig-2g.10gb": 2,
        "nvidia.com/mig-3g.20gb": 3,
        "nvidia.com/mig-7g.40gb": 7,
    }
    t4 = load("002-configmap-time-slicing-config-fine.yaml", "tesla-t4")
    assert t4 == load("002-fine-tesla-t4.yaml")


def test_seed_003_flags_and_gfd() -> None:
    config = load("003-dp-example-config.yaml")
    flags = config.flags
    assert flags.plugin.device_list_strategy == ("envvar",)
    assert flags.plugin.device_id_strategy == "uuid"
    assert flags.gfd.sleep_interval == 60.0
    assert flags.gfd.output_file == "/etc/kubernetes/node-feature-discovery/features.d/gfd"
    assert config.sharing.time_slicing is None
    with_sharing = load("003-dp-example-config-replicas-2.yaml")
    assert with_sharing.flags == flags
    assert with_sharing.sharing.time_slicing is not None
    assert with_sharing.sharing.time_slicing.resources[0].replicas == 2


def test_seed_004_is_the_cluster_wide_config_of_seed_002() -> None:
    assert load("004-configmap-time-slicing-config-all.yaml", "any") == load(
        "002-configmap-time-slicing-config-all.yaml", "any"
    )
