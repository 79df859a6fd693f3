"""Parsing rules: NVIDIA's defaults and shapes, our stricter checks, and that nothing but a
ConfigError ever leaves `parse_config`."""

from __future__ import annotations

import json
import math

import pytest
import yaml

from gpuslice.core.config import parse_config
from gpuslice.core.config.fields import format_go_duration
from gpuslice.core.errors import ConfigError


def _ts(text: str) -> str:
    return "version: v1\nsharing:\n  timeSlicing:\n    resources:\n" + text


def test_defaults_are_those_of_nvidias_plugin_binary() -> None:
    flags = parse_config("").flags
    assert flags.mig_strategy == "none"
    assert flags.fail_on_init_error is True
    assert flags.mps_root == ""
    assert flags.nvidia_driver_root == "/"
    assert flags.effective_dev_root == "/"
    assert (flags.gdrcopy_enabled, flags.gds_enabled, flags.mofed_enabled) == (False,) * 3
    assert flags.use_node_feature_api is None
    assert flags.device_discovery_strategy == "auto"
    plugin = flags.plugin
    assert plugin.pass_device_specs is False
    assert plugin.device_list_strategy == ("envvar",)
    assert plugin.device_id_strategy == "uuid"
    assert plugin.cdi_annotation_prefix == "cdi.k8s.io/"
    assert plugin.nvidia_ctk_path == "/usr/bin/nvidia-ctk"
    assert plugin.container_driver_root == "/driver-root"
    assert plugin.shared_devices_allocation_policy == "distributed"
    gfd = flags.gfd
    assert (gfd.oneshot, gfd.no_timestamp, gfd.sleep_interval) == (False, False, 60.0)
    assert gfd.output_file == "/etc/kubernetes/node-feature-discovery/features.d/gfd"
    assert gfd.machine_type_file == "/sys/class/dmi/id/product_name"


@pytest.mark.parametrize("text", ["", "\n", "# only a comment\n", "---\n", "version: v1\n"])
def test_empty_documents_are_the_default_config(text: str) -> None:
    assert parse_config(text) == parse_config("version: v1")


def test_missing_version_means_v1() -> None:
    assert parse_config("flags: {migStrategy: single}").version == "v1"


def test_null_values_take_the_default() -> None:
    config = parse_config(
        "version: null\nflags:\n  useNodeFeatureAPI: null\n  migStrategy: null\n  gfd: null\n"
    )
    assert config == parse_config("")


@pytest.mark.parametrize("block", ["timeSlicing", "mps"])
def test_empty_sharing_block_is_refused_like_nvidia_replicas_go(block: str) -> None:
    """NVIDIA `api/config/v1/replicas.go` (UnmarshalJSON): a present but empty block has no
    resources and is refused with "no resources specified"."""
    with pytest.raises(ConfigError, match="no resources specified"):
        parse_config(f"sharing:\n  {block}: {{}}\n")


def test_null_time_slicing_is_refused_like_nvidia() -> None:
    """`Sharing.TimeSlicing` is a struct value in NVIDIA's `api/config/v1/sharing.go`:
    encoding/json hands null to its UnmarshalJSON, which finds no resources."""
    for text in ("sharing:\n  timeSlicing:\n", "sharing:\n  timeSlicing: null\n"):
        with pytest.raises(ConfigError, match=r"sharing\.timeSlicing\.resources: no resources"):
            parse_config(text)


@pytest.mark.parametrize("text", ["sharing:\n  mps:\n", "sharing:\n  mps: null\n"])
def test_null_mps_means_nothing_is_shared_by_mps_like_nvidia(text: str) -> None:
    """`Sharing.MPS` is a pointer in NVIDIA's `api/config/v1/sharing.go`: null leaves it nil,
    so the config shares nothing by MPS and the node advertises whole GPUs."""
    config = parse_config(text)
    assert config.sharing.mps is None
    assert config == parse_config("")


def test_null_mps_beside_time_slicing_keeps_the_time_slicing() -> None:
    config = parse_config(
        "sharing:\n  mps: null\n  timeSlicing:\n    resources:\n"
        "    - name: nvidia.com/gpu\n      replicas: 4\n"
    )
    assert config.sharing.mps is None
    assert config.sharing.time_slicing is not None
    assert config.sharing.time_slicing.resources[0].replicas == 4


def test_vfio_discovery_is_refused_like_nvidia_plugin_main_go() -> None:
    """NVIDIA `cmd/nvidia-device-plugin/main.go` validateFlags: the plugin takes auto, nvml
    and tegra; vfio is GPU Feature Discovery's only."""
    with pytest.raises(ConfigError, match="GPU Feature Discovery only") as caught:
        parse_config("flags:\n  deviceDiscoveryStrategy: vfio\n")
    assert "flags.deviceDiscoveryStrategy" in [p.path for p in caught.value.problems]


def test_dump_uses_nvidias_key_spelling() -> None:
    config = parse_config(
        _ts("    - name: gpu\n      replicas: 4\n") + "flags:\n  gfd:\n    sleepInterval: 90s\n"
    )
    doc = config.model_dump(by_alias=True)
    assert doc["version"] == "v1"
    assert doc["flags"]["migStrategy"] == "none"
    assert doc["flags"]["plugin"]["deviceIDStrategy"] == "uuid"
    assert doc["flags"]["plugin"]["nvidiaCTKPath"] == "/usr/bin/nvidia-ctk"
    assert doc["flags"]["plugin"]["deviceListStrategy"] == ["envvar"]
    assert doc["flags"]["gfd"]["sleepInterval"] == "1m30s"
    assert "useNodeFeatureAPI" not in doc["flags"]
    assert doc["sharing"] == {
        "timeSlicing": {
            "renameByDefault": False,
            "failRequestsGreaterThanOne": False,
            "resources": [{"name": "nvidia.com/gpu", "replicas": 4, "devices": "all"}],
        }
    }
    assert json.loads(config.model_dump_json(by_alias=True)) == doc


def test_json_text_is_accepted() -> None:
    doc = {"version": "v1", "sharing": {"mps": {"resources": [{"name": "gpu", "replicas": 3}]}}}
    config = parse_config(json.dumps(doc, indent=2))
    assert config.sharing.mps is not None
    assert config.sharing.mps.resources[0].name == "nvidia.com/gpu"


def test_json_duplicate_keys_are_refused() -> None:
    with pytest.raises(ConfigError, match="duplicate key 'version'"):
        parse_config('{"version": "v1", "version": "v1"}')


def test_yaml_flow_mapping_is_not_mistaken_for_json() -> None:
    assert parse_config("{flags: {migStrategy: mixed}}").flags.mig_strategy == "mixed"


def test_every_problem_is_reported_at_once() -> None:
    text = (
        "version: v1\nflags:\n  migStrategy: double\n  plugin:\n    deviceIDStrategy: serial\n"
        + "sharing:\n  timeSlicing:\n    resources:\n    - name: gpu\n      replicas: 0\n"
        + "    - name: gpu\n      replicass: 2\n"
    )
    with pytest.raises(ConfigError) as caught:
        parse_config(text, source="node.yaml")
    paths = [p.path for p in caught.value.problems]
    assert paths == [
        "flags.migStrategy",
        "flags.plugin.deviceIDStrategy",
        "sharing.timeSlicing.resources[0].replicas",
        "sharing.timeSlicing.resources[1].replicas",
        "sharing.timeSlicing.resources[1].replicass",
    ]
    assert str(caught.value).startswith("invalid config node.yaml: flags.migStrategy: ")


@pytest.mark.parametrize(
    ("name", "full"),
    [
        ("gpu", "nvidia.com/gpu"),
        ("nvidia.com/gpu", "nvidia.com/gpu"),
        ("mig-1g.10gb.me", "nvidia.com/mig-1g.10gb.me"),
        ("gpu.shared", "nvidia.com/gpu.shared"),
    ],
)
def test_resource_names_get_the_nvidia_prefix(name: str, full: str) -> None:
    config = parse_config(_ts(f"    - name: {name}\n      replicas: 2\n      rename: {name}-x\n"))
    assert config.sharing.time_slicing is not None
    entry = config.sharing.time_slicing.resources[0]
    assert (entry.name, entry.rename) == (full, f"{full}-x")


def test_name_of_exactly_63_characters_is_accepted() -> None:
    name = "nvidia.com/" + "g" * 52
    assert len(name) == 63
    parse_config(_ts(f"    - name: {name}\n      replicas: 2\n"))
    with pytest.raises(ConfigError, match="63 characters or less"):
        parse_config(_ts(f"    - name: {name}g\n      replicas: 2\n"))


def test_a_foreign_domain_is_refused() -> None:
    with pytest.raises(ConfigError, match="incorrect format for resource name"):
        parse_config(_ts("    - name: example.com/gpu\n      replicas: 2\n"))


@pytest.mark.parametrize(
    ("devices", "parsed"),
    [
        ("all", "all"),
        ("3", 3),
        ("[0, 2]", ("0", "2")),
        ("['1', '0:3']", ("1", "0:3")),
        ("[0, 0]", ("0",)),
        (
            "[GPU-b1028956-cfa2-0990-bf4a-5da9abb51763, MIG-b1028956-cfa2-0990-bf4a-5da9abb51763]",
            (
                "GPU-b1028956-cfa2-0990-bf4a-5da9abb51763",
                "MIG-b1028956-cfa2-0990-bf4a-5da9abb51763",
            ),
        ),
        (
            "['MIG-GPU-b1028956-cfa2-0990-bf4a-5da9abb51763/3/0']",
            ("MIG-GPU-b1028956-cfa2-0990-bf4a-5da9abb51763/3/0",),
        ),
    ],
)
def test_device_selection_forms(devices: str, parsed: object) -> None:
    config = parse_config(_ts(f"    - name: gpu\n      replicas: 2\n      devices: {devices}\n"))
    assert config.sharing.time_slicing is not None
    assert config.sharing.time_slicing.resources[0].devices == parsed


def test_missing_devices_means_all() -> None:
    config = parse_config(_ts("    - name: gpu\n      replicas: 2\n"))
    assert config.sharing.time_slicing is not None
    assert config.sharing.time_slicing.resources[0].devices == "all"


def test_disjoint_entries_for_one_resource_are_allowed() -> None:
    """The per-GPU sharing extension: GPU 0 with 8 replicas, GPUs 1-3 with 2."""
    config = parse_config(
        _ts(
            "    - name: gpu\n      replicas: 8\n      devices: [0]\n"
            "    - name: gpu\n      replicas: 2\n      devices: [1, 2, 3]\n"
        )
    )
    assert config.sharing.time_slicing is not None
    assert [r.replicas for r in config.sharing.time_slicing.resources] == [8, 2]


def test_count_and_higher_indices_do_not_overlap() -> None:
    parse_config(
        _ts(
            "    - name: gpu\n      replicas: 8\n      devices: 2\n"
            "    - name: gpu\n      replicas: 2\n      devices: [2, 3]\n"
        )
    )


def test_replicas_one_is_accepted() -> None:
    config = parse_config(_ts("    - name: gpu\n      replicas: 1\n"))
    assert config.sharing.time_slicing is not None
    assert config.sharing.time_slicing.resources[0].replicas == 1


def test_fail_requests_defaults_per_block() -> None:
    mps = (
        "version: v1\nsharing:\n  mps:\n{extra}    resources:\n    - name: gpu\n      replicas: 2\n"
    )
    implicit = parse_config(mps.format(extra=""))
    assert implicit.sharing.mps is not None
    assert implicit.sharing.mps.fail_requests_greater_than_one is True
    explicit = parse_config(mps.format(extra="    failRequestsGreaterThanOne: false\n"))
    assert explicit.sharing.mps is not None
    assert explicit.sharing.mps.fail_requests_greater_than_one is False
    ts = parse_config(_ts("    - name: gpu\n      replicas: 2\n")).sharing.time_slicing
    assert ts is not None
    assert ts.fail_requests_greater_than_one is False


def test_device_list_strategy_string_or_list() -> None:
    one = parse_config("flags:\n  plugin:\n    deviceListStrategy: cdi-cri\n")
    many = parse_config("flags:\n  plugin:\n    deviceListStrategy: [envvar, volume-mounts]\n")
    assert one.flags.plugin.device_list_strategy == ("cdi-cri",)
    assert many.flags.plugin.device_list_strategy == ("envvar", "volume-mounts")


def test_yaml_booleans_are_booleans() -> None:
    assert parse_config("flags:\n  failOnInitError: no\n").flags.fail_on_init_error is False


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        ("60s", 60.0),
        ("1m30s", 90.0),
        ("1.5h", 5400.0),
        ("300ms", 0.3),
        ("2h45m", 9900.0),
        ("60000000000", 60.0),
        ("'infinite'", math.inf),
    ],
)
def test_sleep_interval_forms(value: str, seconds: float) -> None:
    config = parse_config(f"flags:\n  gfd:\n    sleepInterval: {value}\n")
    assert config.flags.gfd.sleep_interval == pytest.approx(seconds)


@pytest.mark.parametrize("value", ["0s", "-5s", "5 minutes", "5d", "'1m30'", "true"])
def test_bad_sleep_intervals(value: str) -> None:
    with pytest.raises(ConfigError, match=r"flags\.gfd\.sleepInterval: "):
        parse_config(f"flags:\n  gfd:\n    sleepInterval: {value}\n")


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (60.0, "1m0s"),
        (90.0, "1m30s"),
        (3600.0, "1h0m0s"),
        (3723.5, "1h2m3.5s"),
        (5.0, "5s"),
        (0.3, "300ms"),
        (0.0000015, "1.5\u00b5s"),
        (math.inf, "infinite"),
    ],
)
def test_durations_are_written_as_go_does(seconds: float, text: str) -> None:
    assert format_go_duration(seconds) == text


def test_imex_channel_zero() -> None:
    config = parse_config("imex:\n  channelIDs: [0]\n  required: true\n")
    assert config.imex.channel_ids == (0,)
    assert config.imex.required is True


@pytest.mark.parametrize(
    "text",
    [
        "!!python/object/apply:os.system ['true']",
        "flags: 5",
        "flags: [1, 2]",
        "? [a, b]\n: c\n",
        "1: 2",
        "version: v1\nsharing:\n  timeSlicing:\n    resources:\n    - 5\n",
        "version: v1\nsharing:\n  timeSlicing:\n    resources:\n    - [name, gpu]\n",
        "flags:\n  gfd:\n    sleepInterval: 1e400\n",
        "\t- bad",
        "a: &x [*x]",
        "key: 'unterminated",
        "\x00\x01",
        "[" * 200,
        "version: v1\nversion: v1\n",
        "flags:\n  plugin:\n    deviceListStrategy: []\n",
        "resources:\n  gpus:\n  - pattern: ''\n    name: gpu\n",
        "sharing:\n  timeSlicing:\n    resources:\n    - name: 5\n      replicas: 2\n",
        "flags:\n  gfd:\n    sleepInterval: .nan\n",
        "a: " + "[" * 5000 + "]" * 5000,
        "flags: " + "{a: " * 3000 + "1" + "}" * 3000,
        '{"a": ' * 5000 + "1" + "}" * 5000,
    ],
)
def test_nothing_but_config_error_escapes(text: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(text, source="weird.yaml")
    assert caught.value.problems
    assert "Traceback" not in str(caught.value)


def test_dump_round_trips_through_yaml() -> None:
    text = (
        _ts(
            "    - name: gpu\n      replicas: 8\n      devices: [0]\n      rename: gpu.big\n"
            "    - name: gpu\n      replicas: 2\n      devices: [1, 2]\n"
        )
        + "flags:\n  gfd:\n    sleepInterval: infinite\n"
    )
    config = parse_config(text)
    assert parse_config(yaml.safe_dump(config.model_dump(by_alias=True))) == config


def _expanding_document(width: int, levels: int) -> str:
    """A document whose aliases expand to width**levels values from a few lines of text."""
    lines = ["a0: &a0 [x]"]
    for level in range(1, levels + 1):
        refs = ", ".join(f"*a{level - 1}" for _ in range(width))
        lines.append(f"a{level}: &a{level} [{refs}]")
    return "\n".join(lines) + "\n"


def test_a_stream_of_documents_is_bounded_as_a_whole() -> None:
    from gpuslice.core.config.parsing import MAX_NODES, load_documents

    one = _expanding_document(10, 4)  # about 11,000 values once expanded: fine alone
    assert len(load_documents(one)) == 1
    copies = MAX_NODES // 10_000 + 1
    stream = "---\n".join([one] * copies)
    with pytest.raises(ConfigError, match="expand to more than"):
        load_documents(stream)


def test_a_stream_keeps_every_document_in_order() -> None:
    from gpuslice.core.config.parsing import load_documents

    docs = load_documents("kind: Namespace\n---\nkind: ConfigMap\ndata: {a: b}\n---\n")
    # a trailing `---` starts an empty document, as in PyYAML's safe_load_all
    assert docs == [{"kind": "Namespace"}, {"kind": "ConfigMap", "data": {"a": "b"}}, None]


def test_manifests_keep_date_like_scalars_as_strings_configs_refuse_impossible_dates() -> None:
    """Kubernetes reads `2001-02-30` (and `2001-02-28`) in a manifest as a string; a config
    has no date fields, so there an impossible date is a rejection with its position."""
    from gpuslice.core.config.parsing import load_documents

    text = "a: 2001-02-30\nb: 2001-02-28 10:00:00\nc: 1\n---\n- 2001-02-30\n"
    assert load_documents(text, timestamps=False) == [
        {"a": "2001-02-30", "b": "2001-02-28 10:00:00", "c": 1},
        ["2001-02-30"],
    ]
    with pytest.raises(ConfigError, match=r"line 1, column 4: cannot read '2001-02-30'"):
        load_documents(text)
    with pytest.raises(ConfigError, match="nested more than"):
        load_documents("- " * 100_000 + "x\n", timestamps=False)
