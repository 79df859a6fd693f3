"""`dra.enabled`: the chart runs the agent as a DRA kubelet plugin (docs/install.md, "DRA
mode"): DeviceClasses as NVIDIA ships them, ResourceSlice RBAC and its admission policy,
the kubelet's DRA directories mounted at their host paths, and no device-plugin socket.

Rendered through scripts/check-chart like the other chart tests (test_chart fails instead of
skipping under CI when the tooling is missing); the CEL in the DeviceClasses and in the
admission policy is run with celpy against what the agent really publishes."""

from __future__ import annotations

import base64
import json
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

import celpy
import click
import pytest
import yaml

from gpuslice.core.jsontypes import Json
from tests.chart.chart_support import SETS, check_chart, container_of, env_of, one, render

ROOT = Path(__file__).resolve().parents[2]
DRA = {"enabled": True}
NVIDIA = "gpu.nvidia.com"


def kinds(result: Any) -> list[str]:
    return [str(m["kind"]) for m in result.manifests]


def classes(result: Any) -> dict[str, Json]:
    return {m["metadata"]["name"]: m for m in result.manifests if m["kind"] == "DeviceClass"}


def selector(device_class: Json) -> str:
    [sel] = device_class["spec"]["selectors"]
    return str(sel["cel"]["expression"])


def resource_rules(result: Any) -> list[Json]:
    rules = one(result, "ClusterRole")["rules"]
    return [r for r in rules if r["apiGroups"] == ["resource.k8s.io"]]


def pod_of(result: Any) -> Json:
    return dict(one(result, "DaemonSet")["spec"]["template"]["spec"])


def host_volumes(result: Any) -> dict[str, Json]:
    return {v["name"]: v["hostPath"] for v in pod_of(result)["volumes"] if "hostPath" in v}


def mounts(result: Any) -> dict[str, str]:
    return {m["name"]: m["mountPath"] for m in container_of(result)["volumeMounts"]}


# -- off by default ------------------------------------------------------------------------


def test_default_values_render_no_dra_objects() -> None:
    result = render()
    assert result.ok, result.problems
    assert "DeviceClass" not in kinds(result)
    assert "ValidatingAdmissionPolicy" not in kinds(result)
    assert resource_rules(result) == []
    env = env_of(one(result, "DaemonSet"))
    assert not {"DRA", "DRA_DRIVER_NAME", "DRA_PLUGIN_DIR", "DRA_REGISTRY_DIR", "CDI_ROOT"} & set(
        env
    )
    assert mounts(result)["device-plugins"] == "/var/lib/kubelet/device-plugins"
    paths = {v["path"] for v in host_volumes(result).values()}
    assert not {"/var/lib/kubelet/plugins_registry", "/var/run/cdi"} & paths
    assert not [p for p in paths if p.startswith("/var/lib/kubelet/plugins/")]
    # the values' updateStrategy as given: the maxSurge pin is DRA mode's
    assert one(result, "DaemonSet")["spec"]["updateStrategy"] == {"type": "RollingUpdate"}


def test_the_dra_values_set_is_checked_like_every_other() -> None:
    """ci/dra.yaml is picked up by scripts/check-chart (and the parametrized test in
    test_chart) as a full DRA render."""
    assert SETS["dra"]["dra"]["enabled"] is True
    result = render("dra")
    assert result.ok, result.problems
    assert set(classes(result)) == {"gpu.nvidia.com", "mig.nvidia.com"}


# -- DeviceClasses -------------------------------------------------------------------------


def test_device_classes_as_nvidia_ships_them() -> None:
    result = render(dra=DRA)
    assert result.ok, result.problems
    found = classes(result)
    assert set(found) == {"gpu.nvidia.com", "mig.nvidia.com"}
    for obj in found.values():
        assert obj["apiVersion"] == "resource.k8s.io/v1"
        assert "namespace" not in obj["metadata"], "DeviceClasses are cluster-scoped"
    assert selector(found["gpu.nvidia.com"]) == (
        "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'"
    )
    assert selector(found["mig.nvidia.com"]) == (
        "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'mig'"
    )
    assert "extendedResourceName" not in found["gpu.nvidia.com"]["spec"], "optional"


def test_extended_resource_name_goes_on_the_gpu_class_only() -> None:
    result = render(dra={**DRA, "deviceClasses": {"extendedResourceName": "nvidia.com/gpu"}})
    assert result.ok, result.problems
    found = classes(result)
    assert found["gpu.nvidia.com"]["spec"]["extendedResourceName"] == "nvidia.com/gpu"
    assert "extendedResourceName" not in found["mig.nvidia.com"]["spec"]


@pytest.mark.parametrize(
    ("driver", "gpu_class", "mig_class"),
    [
        ("gpu.example.com", "gpu.example.com", "mig.example.com"),
        ("accel.example.com", "gpu.accel.example.com", "mig.accel.example.com"),
    ],
)
def test_class_names_follow_the_driver_name(driver: str, gpu_class: str, mig_class: str) -> None:
    result = render(dra={**DRA, "driverName": driver})
    assert result.ok, result.problems
    found = classes(result)
    assert set(found) == {gpu_class, mig_class}
    assert selector(found[gpu_class]) == (
        f"device.driver == '{driver}' && device.attributes['{driver}'].type == 'gpu'"
    )
    assert ".type == 'mig'" in selector(found[mig_class])
    env = env_of(one(result, "DaemonSet"))
    assert env["DRA_DRIVER_NAME"] == driver
    assert env["DRA_PLUGIN_DIR"] == f"/var/lib/kubelet/plugins/{driver}"


def test_device_classes_can_be_left_to_someone_else() -> None:
    result = render(dra={**DRA, "deviceClasses": {"create": False}})
    assert result.ok, result.problems
    assert "DeviceClass" not in kinds(result)
    assert env_of(one(result, "DaemonSet"))["DRA"] == "true", "the driver itself still runs"
    assert resource_rules(result), "and still needs its RBAC"


def _inventory(node: str) -> Any:
    from gpuslice.backends import open_backend

    backend = open_backend(node)
    try:
        return backend.inventory()
    finally:
        backend.close()


def cel_device(driver: str, device: Json) -> Json:
    """A published device as a DeviceClass selector sees it: attribute names without a
    domain belong to the driver's domain (REFERENCE-DRA §3.3/§3.4)."""
    attributes: dict[str, Json] = {}
    for name, value in device["attributes"].items():
        domain, _, ident = name.rpartition("/")
        [typed] = value.values()
        attributes.setdefault(domain or driver, {})[ident] = typed
    return {"driver": driver, "attributes": attributes}


def selects(expression: str, device: Json) -> bool:
    env = celpy.Environment()
    result = env.program(env.compile(expression)).evaluate({"device": celpy.json_to_cel(device)})
    assert isinstance(result, celpy.celtypes.BoolType), result
    return bool(result)


def test_the_classes_select_the_devices_the_agent_publishes() -> None:
    """The selectors against the agent's own device JSON (core.dra.publish over the
    simulated backend): whole GPUs in the gpu class, MIG devices in the mig class, nothing
    of another driver in either."""
    from gpuslice.core.dra.publish import device_json, dra_devices

    found = classes(render(dra=DRA))
    gpu_sel, mig_sel = selector(found["gpu.nvidia.com"]), selector(found["mig.nvidia.com"])
    whole = [device_json(d, []) for d in dra_devices(_inventory("sim:2xh100-80gb"))]
    mig = [
        device_json(d, [])
        for d in dra_devices(_inventory("sim:1xa100-40gb/mig=3g.20gb*1+1g.5gb*2"))
    ]
    assert len(whole) == 2
    assert len(mig) == 3
    for device in whole:
        assert selects(gpu_sel, cel_device(NVIDIA, device))
        assert not selects(mig_sel, cel_device(NVIDIA, device))
        assert not selects(gpu_sel, cel_device("gpu.example.com", device))
    for device in mig:
        assert selects(mig_sel, cel_device(NVIDIA, device))
        assert not selects(gpu_sel, cel_device(NVIDIA, device))


# -- the agent's pod -----------------------------------------------------------------------


def test_the_agent_runs_in_dra_mode_with_the_clis_variables() -> None:
    from gpuslice.cli.main import main

    plugin = main.get_command(click.Context(main), "plugin")  # subcommands load lazily
    assert plugin is not None
    envvars = {p.envvar for p in plugin.params}
    env = env_of(one(render(dra=DRA), "DaemonSet"))
    dra_env = {
        "DRA": "true",
        "DRA_DRIVER_NAME": "gpu.nvidia.com",
        "DRA_PLUGIN_DIR": "/var/lib/kubelet/plugins/gpu.nvidia.com",
        "DRA_REGISTRY_DIR": "/var/lib/kubelet/plugins_registry",
        "CDI_ROOT": "/var/run/cdi",
        "CONSUMABLE_SHARES": "replicas",
    }
    for name, value in dra_env.items():
        assert env[name] == value, name
        assert name in envvars, f"`gpuslice plugin` reads no {name}"
    assert env["NODE_NAME"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}


@pytest.mark.parametrize("value", ["memory", "unlimited", "disabled", "4"])
def test_nvidias_consumable_shares_values_reach_the_agent(value: str) -> None:
    env = env_of(one(render(dra={**DRA, "consumableShares": value}), "DaemonSet"))
    assert env["CONSUMABLE_SHARES"] == value


@pytest.mark.parametrize(
    "dra",
    [
        DRA,
        {
            **DRA,
            "driverName": "gpu.example.com",
            "kubeletPluginsDir": "/data/kubelet/plugins/",
            "registryDir": "/data/kubelet/plugins_registry",
            "cdiRoot": "/etc/cdi",
        },
    ],
)
def test_dra_directories_are_mounted_at_their_host_paths(dra: Json) -> None:
    """The kubelet dials the socket paths the agent reports, so each path must be the
    same inside the container as on the host; no device-plugin socket directory."""
    values = check_chart.deep_merge(SETS["default"]["dra"], dra)
    result = render(dra=dra)
    assert result.ok, result.problems
    env = env_of(one(result, "DaemonSet"))
    plugin_dir = values["kubeletPluginsDir"].rstrip("/") + "/" + values["driverName"]
    expected = {
        "dra-registry": (values["registryDir"], "Directory"),
        "dra-plugin": (plugin_dir, "DirectoryOrCreate"),
        "cdi-root": (values["cdiRoot"], "DirectoryOrCreate"),
    }
    volumes, mounted = host_volumes(result), mounts(result)
    for name, (path, kind) in expected.items():
        assert volumes[name] == {"path": path, "type": kind}, name
        assert mounted[name] == path, f"{name}: container path differs from the host path"
    assert env["DRA_PLUGIN_DIR"] == plugin_dir
    assert env["DRA_REGISTRY_DIR"] == values["registryDir"]
    assert env["CDI_ROOT"] == values["cdiRoot"]
    assert "device-plugins" not in volumes
    assert "device-plugins" not in mounted
    assert not [p for p in mounted.values() if p.startswith("/var/lib/kubelet/device-plugins")]
    # the rest of the agent stays: PodResources (claims per pod), MPS, labels
    assert mounted["pod-resources"] == "/var/lib/kubelet/pod-resources"
    assert "mps-root" in mounted
    assert "features-d" in mounted


def test_dra_mode_runs_as_root_and_otherwise_keeps_least_privilege() -> None:
    """Sockets in root-owned kubelet directories need root; nothing else is added."""
    result = render(dra=DRA)
    ctx = container_of(result)["securityContext"]
    assert ctx["runAsUser"] == 0
    assert ctx["privileged"] is False
    assert ctx["allowPrivilegeEscalation"] is False
    assert ctx["capabilities"] == {"drop": ["ALL"]}
    assert ctx["readOnlyRootFilesystem"] is True
    assert pod_of(result)["hostPID"] is False
    mps = container_of(render(dra=DRA, mps={"enabled": True}))["securityContext"]
    assert mps["privileged"] is True, "MPS asks for privilege as in device-plugin mode"


def test_rolling_updates_keep_max_surge_zero() -> None:
    strategy = one(render(dra=DRA), "DaemonSet")["spec"]["updateStrategy"]
    assert strategy == {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0}}
    kept = render(
        dra=DRA,
        updateStrategy={
            "type": "RollingUpdate",
            "rollingUpdate": {"maxUnavailable": "10%", "maxSurge": 0},
        },
    )
    assert kept.ok, kept.problems
    assert one(kept, "DaemonSet")["spec"]["updateStrategy"]["rollingUpdate"] == {
        "maxUnavailable": "10%",
        "maxSurge": 0,
    }
    on_delete = render(dra=DRA, updateStrategy={"type": "OnDelete"})
    assert on_delete.ok, on_delete.problems
    assert one(on_delete, "DaemonSet")["spec"]["updateStrategy"] == {"type": "OnDelete"}


@pytest.mark.parametrize("surge", [1, "25%"])
def test_a_surging_rolling_update_is_refused_in_dra_mode(surge: Any) -> None:
    strategy = {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": surge, "maxUnavailable": 0}}
    result = render(dra=DRA, updateStrategy=strategy)
    assert not result.ok
    assert any(
        p.startswith(f"chart validation: updateStrategy.rollingUpdate.maxSurge={surge} with dra")
        for p in result.problems
    ), result.problems
    assert render(updateStrategy=strategy).ok, "device-plugin mode: the user's choice"


# -- RBAC and the admission policy ---------------------------------------------------------


def test_rbac_for_resource_slices_and_claims_only_in_dra_mode() -> None:
    """The verbs `k8s.dra.DraApi` uses (docs/install.md, "API access"); no DeviceClasses:
    a class's configs reach the driver inside the claim's allocation."""
    result = render(dra=DRA)
    assert resource_rules(result) == [
        {
            "apiGroups": ["resource.k8s.io"],
            "resources": ["resourceslices"],
            "verbs": ["list", "watch", "create", "update", "delete"],
        },
        {
            "apiGroups": ["resource.k8s.io"],
            "resources": ["resourceclaims"],
            "verbs": ["get", "list", "watch"],
        },
    ]
    assert resource_rules(render()) == []
    node_verbs = {
        v
        for r in one(result, "ClusterRole")["rules"]
        if "nodes" in r["resources"]
        for v in r["verbs"]
    }
    assert "get" in node_verbs, "the slices' owner reference needs the Node's UID"
    assert "patch" not in node_verbs


def slice_policy(**values: Any) -> Json:
    [policy] = [
        m
        for m in render(dra=DRA, **values).manifests
        if m["kind"] == "ValidatingAdmissionPolicy"
        and m["metadata"]["name"].endswith("-resourceslices")
    ]
    return dict(policy)


def test_slice_policy_is_bound_and_can_be_turned_off() -> None:
    result = render(dra=DRA)
    [binding] = [
        m
        for m in result.manifests
        if m["kind"] == "ValidatingAdmissionPolicyBinding"
        and m["metadata"]["name"].endswith("-resourceslices")
    ]
    assert binding["spec"] == {
        "policyName": slice_policy()["metadata"]["name"],
        "validationActions": ["Deny"],
    }
    [rule] = slice_policy()["spec"]["matchConstraints"]["resourceRules"]
    assert rule["apiGroups"] == ["resource.k8s.io"]
    assert rule["resources"] == ["resourceslices"]
    assert set(rule["operations"]) == {"CREATE", "UPDATE", "DELETE"}
    off = render(dra={**DRA, "restrictResourceSlices": False})
    assert off.ok, off.problems
    assert not [m for m in off.manifests if m["metadata"]["name"].endswith("-resourceslices")]
    both = render(dra=DRA, labels={"mode": "api"})
    assert both.ok, both.problems
    names = [
        m["metadata"]["name"] for m in both.manifests if m["kind"] == "ValidatingAdmissionPolicy"
    ]
    assert len(names) == len(set(names)) == 4, (
        "the node-patch policy, this one, claim configs, claim events"
    )


def _agent_user() -> str:
    account = one(render(dra=DRA), "ServiceAccount")["metadata"]
    return f"system:serviceaccount:{account['namespace']}:{account['name']}"


SA = _agent_user()
NODE_EXTRA = "authentication.kubernetes.io/node-name"


def _eval(expression: str, activation: Json) -> Any:
    env = celpy.Environment()
    return env.program(env.compile(expression)).evaluate(activation)


def slice_admitted(
    operation: str, node: str, driver: str, token_node: str | None, user: str = SA
) -> bool:
    obj = {"metadata": {"name": "s"}, "spec": {"driver": driver, "nodeName": node}}
    info: Json = {"username": user}
    if token_node is not None:
        info["extra"] = {NODE_EXTRA: [token_node]}
    activation: Json = {
        "request": celpy.json_to_cel({"operation": operation, "userInfo": info}),
        "object": celpy.json_to_cel(None if operation == "DELETE" else obj),
        "oldObject": celpy.json_to_cel(None if operation == "CREATE" else obj),
    }
    spec = slice_policy()["spec"]
    [cond] = spec["matchConditions"]
    if not bool(_eval(cond["expression"], activation)):
        return True  # not the agent: the policy does not apply
    variables = {
        celpy.celtypes.StringType(v["name"]): _eval(v["expression"], activation)
        for v in spec["variables"]
    }
    activation["variables"] = celpy.celtypes.MapType(variables)
    verdicts = [_eval(v["expression"], activation) for v in spec["validations"]]
    assert all(isinstance(v, celpy.celtypes.BoolType) for v in verdicts), verdicts
    return all(bool(v) for v in verdicts)


@pytest.mark.parametrize("operation", ["CREATE", "UPDATE", "DELETE"])
@pytest.mark.parametrize(
    ("node", "driver", "token_node", "user", "expected"),
    [
        ("gpu-1", NVIDIA, "gpu-1", SA, True),  # its own node's slice of its driver
        ("gpu-2", NVIDIA, "gpu-1", SA, False),  # another node's
        ("gpu-1", "other.example.com", "gpu-1", SA, False),  # another driver's
        ("gpu-1", NVIDIA, None, SA, False),  # a token without a node (not a pod's)
        ("gpu-2", NVIDIA, "gpu-1", "kubernetes-admin", True),  # not the agent: not ours to judge
    ],
)
def test_resource_slice_policy(
    operation: str, node: str, driver: str, token_node: str | None, user: str, expected: bool
) -> None:
    assert slice_admitted(operation, node, driver, token_node, user) is expected


# -- schema and manifests ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        ({"dra": {"enable": True}}, "'enable' was unexpected"),
        (
            {"dra": {"deviceClasses": {"extendedResource": "nvidia.com/gpu"}}},
            "'extendedResource' was unexpected",
        ),
        ({"dra": {"cdiroot": "/etc/cdi"}}, "'cdiroot' was unexpected"),
        (
            {"dra": {"driverName": "GPU.nvidia.com"}},
            "dra.driverName: 'GPU.nvidia.com' does not match",
        ),
        (
            {"dra": {"kubeletPluginsDir": "var/lib/kubelet/plugins"}},
            "dra.kubeletPluginsDir: 'var/lib/kubelet/plugins' does not match",
        ),
        (
            {"dra": {"deviceClasses": {"extendedResourceName": "gpu"}}},
            "dra.deviceClasses.extendedResourceName: 'gpu' is not valid",
        ),
        ({"dra": {"enabled": "yes"}}, "dra.enabled: 'yes' is not of type 'boolean'"),
        (
            {"dra": {"consumableShares": "half"}},
            "dra.consumableShares: 'half' does not match",
        ),
    ],
)
def test_a_typo_under_dra_is_refused_by_the_schema_and_by_helm(overrides: Json, named: str) -> None:
    result = render(**overrides)
    assert not result.ok
    assert any(named in p for p in result.problems), result.problems
    assert "helm lint error in values.yaml" in result.problems, "real Helm refuses it too"


def test_dra_manifests_pass_strict_kubernetes_schemas() -> None:
    """Every object, DeviceClass included, is validated (strict) against the newest bundled
    Kubernetes schema; the 1.26 schemas know no resource.k8s.io/v1, so for those objects the
    newest is the only check, and it is a real one."""
    import kubernetes_validate

    result = render(dra={**DRA, "deviceClasses": {"extendedResourceName": "nvidia.com/gpu"}})
    assert result.ok, result.problems
    assert result.not_validated == []
    device_class = classes(result)["gpu.nvidia.com"]
    latest = kubernetes_validate.latest_version()
    kubernetes_validate.validate(device_class, latest, strict=True)
    with pytest.raises(kubernetes_validate.SchemaNotFoundError):
        kubernetes_validate.validate(device_class, "1.26", strict=True)
    broken = {**device_class, "spec": {**device_class["spec"], "extendedResource": "x"}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, latest, strict=True)


# -- NOTES and docs ------------------------------------------------------------------------


def render_notes(**overrides: Any) -> str:
    """NOTES.txt through Helm's renderer (scripts/check-chart's capture trick, pointed at
    NOTES.txt, which the manifest capture leaves out)."""
    values = check_chart.deep_merge(SETS["default"], overrides)
    values = check_chart.deep_merge(values, {"namespaceOverride": check_chart.RENDER_NAMESPACE})
    with tempfile.TemporaryDirectory(prefix="gpuslice-notes-") as tmp:
        work = Path(tmp) / check_chart.CHART.name
        shutil.copytree(check_chart.CHART, work, ignore=shutil.ignore_patterns("ci"))
        (work / "values.yaml").write_text(yaml.safe_dump(values))
        capture = check_chart._capture_template(["NOTES.txt"])
        (work / "templates" / check_chart.CAPTURE_TEMPLATE).write_text(capture)
        with check_chart.captured_stderr() as log:
            check_chart._lint(work)
    for line in log:
        match = check_chart._FAIL_LINE.search(line)
        if match:
            message = str(json.loads(match.group(1)))
            if message.startswith(check_chart.CAPTURE_MARK):
                return base64.b64decode(message[len(check_chart.CAPTURE_MARK) :]).decode()
    raise AssertionError("NOTES.txt did not render:\n" + "\n".join(log[-20:]))


def test_notes_say_device_plugin_or_dra_never_both() -> None:
    default = render_notes()
    assert "device plugins are registered" in default
    assert "DRA" not in default
    notes = render_notes(dra={**DRA, "deviceClasses": {"extendedResourceName": "nvidia.com/gpu"}})
    flat = " ".join(notes.split())
    assert "never both" in flat
    assert "NVIDIA's device plugin or NVIDIA's DRA driver" in flat
    assert "gpu.nvidia.com (whole GPUs, also as extended resource nvidia.com/gpu" in flat
    assert "mig.nvidia.com (MIG devices)" in flat
    assert (
        "ResourceSlices (list/watch/create/update/delete), ResourceClaims (get/list/watch)" in flat
    )


def test_notes_name_the_probe_port_and_a_host_network() -> None:
    """The readiness probe is on `probes.port` (not the metrics port), and the host network
    is a privilege the notes list when asked for."""
    default = " ".join(render_notes().split())
    assert "readiness probe on /readyz, port 9401" in default
    assert "host network" not in default
    on_host = " ".join(render_notes(hostNetwork=True, metrics={"port": 9402}).split())
    assert "host network namespace: hostNetwork (ports 9402 and 9401" in on_host


def _leaves(values: Json, prefix: str) -> list[str]:
    out: list[str] = []
    for key, value in values.items():
        if isinstance(value, dict):
            out += _leaves(value, f"{prefix}{key}.")
        else:
            out.append(f"{prefix}{key}")
    return out


def test_install_docs_have_a_dra_section_naming_every_dra_value() -> None:
    text = (ROOT / "docs/install.md").read_text()
    match = re.search(r"^## DRA mode\n(.*?)(?=^## )", text, re.S | re.M)
    assert match, "docs/install.md has no '## DRA mode' section"
    section = match.group(1)
    for name in _leaves(SETS["default"]["dra"], "dra."):
        assert f"`{name}`" in section, f"{name} is not documented in 'DRA mode'"
    assert "--set dra.enabled=true" in section
    for fact in ("1.34", "DRAConsumableCapacity", "DRAExtendedResource", "never both"):
        assert fact in section, fact


def test_notes_send_rejected_configs_to_the_agents_pod_events_and_list_enforces_privileges() -> (
    None
):
    """The agent posts a refused config as an Event about its own Pod in its namespace
    (`k8s.events`: the Role allows no other namespace), so NOTES must not send operators
    to `kubectl describe node`; and an enforcing guard's host PID namespace and CAP_KILL
    are privileges the notes list, as docs/install.md's table does."""
    notes = " ".join(render_notes(config={"map": {"a": "version: v1\n"}}).split())
    assert "Events on the agent's pod" in notes
    assert f"kubectl events -n {check_chart.RENDER_NAMESPACE} --for pod/<agent pod>" in notes
    assert "kubectl describe node <node>" not in notes
    enforce = " ".join(render_notes(memoryGuard={"mode": "enforce"}).split())
    assert "host PID namespace: memoryGuard.mode=enforce" in enforce
    assert "CAP_KILL added: memoryGuard.mode=enforce with action kill" in enforce
    default = " ".join(render_notes().split())
    assert "CAP_KILL" not in default


def test_claim_events_are_narrowed_to_claims_by_a_policy() -> None:
    """dra.enabled grants Events in every namespace for a claim's warnings (issue 41); RBAC
    cannot narrow that grant, a policy does: outside the release namespace, only Events
    about ResourceClaims (checked against the real API server in tests/real_k8s)."""
    result = render(dra=DRA)
    assert result.ok, result.problems
    [policy] = [
        m
        for m in result.manifests
        if m["kind"] == "ValidatingAdmissionPolicy"
        and m["metadata"]["name"].endswith("-claim-events")
    ]
    [rule] = policy["spec"]["matchConstraints"]["resourceRules"]
    assert (rule["apiGroups"], rule["resources"]) == ([""], ["events"])
    assert set(rule["operations"]) == {"CREATE", "UPDATE"}
    [check] = policy["spec"]["validations"]
    assert "ResourceClaim" in check["expression"]
    [binding] = [
        m
        for m in result.manifests
        if m["kind"] == "ValidatingAdmissionPolicyBinding"
        and m["metadata"]["name"].endswith("-claim-events")
    ]
    assert binding["spec"]["validationActions"] == ["Deny"]
    assert not [m for m in render().manifests if m["metadata"]["name"].endswith("-claim-events")]
