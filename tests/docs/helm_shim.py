"""`helm` for the docs' commands: the `install`, `upgrade` and `uninstall` the docs use, with
their flags parsed as Helm's CLI parses them, run by real Helm (helm-sdkpy embeds Helm v4)
against the API server `KUBECONFIG` names.

There is no `helm` binary on these machines (docs/TOOLING: none in Debian bookworm), and the
point of running the docs' commands is that what a user pastes is what the API server gets:
`--set` types `true` as a boolean and `42` as an integer (what made the migration guide's
`nodeSelector` a boolean the API server refused), `--set-string` keeps strings, `-f` files
are merged first and `--set` over them, `\\.` escapes a dot in a key. Nothing is waited for:
this tier has no kubelet, so no agent pod would ever be Ready.

Helm validates the Namespace `--create-namespace` makes against the API server's OpenAPI
document, which kube-apiserver 1.36.2 as envtest starts it cannot give (it answers 503 for
OpenAPI v2 in protobuf: "$root has invalid property: Extensions" in its log): the shim then
makes the namespace with kubectl, says so, and Helm installs the release (the chart's own
objects are not validated that way). Where Helm's install still cannot run for that reason,
the shim falls back to what `helm install` does without its release bookkeeping: Helm's
renderer (with the values schema, as `scripts/check-chart` runs it) and `kubectl apply` of
the manifests, the API server decoding and admitting every object. It says so on stderr.
"""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from gpuslice.core.jsontypes import Json

_INT = re.compile(r"^[-+]?[0-9]+$")


def _split(text: str, sep: str) -> list[str]:
    """Split on `sep` not escaped by a backslash; the escapes stay for the next step."""
    parts = re.split(rf"(?<!\\){re.escape(sep)}", text)
    return parts


def _typed(value: str, strings: bool) -> Any:
    """`--set`'s typing (Helm's strvals): true/false, null and integers; else a string."""
    if strings:
        return value
    if value in ("true", "false"):
        return value == "true"
    if value == "null":
        return None
    if _INT.match(value):
        return int(value)
    return value


def set_value(values: Json, assignment: str, *, strings: bool) -> None:
    for item in _split(assignment, ","):
        key, eq, raw = item.partition("=")
        if not eq:
            raise SystemExit(f"Error: failed parsing --set data: key {key!r} has no value")
        path = [k.replace("\\.", ".") for k in _split(key, ".")]
        target = values
        for part in path[:-1]:
            target = target.setdefault(part, {})
        target[path[-1]] = _typed(raw.replace("\\,", ","), strings)


def merge(base: Json, over: Json) -> Json:
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = value
    return out


def parse(argv: list[str]) -> tuple[str, list[str], str, bool, Json]:
    """(verb, positional, namespace, create_namespace, values)."""
    verb, rest = argv[0], argv[1:]
    positional: list[str] = []
    namespace = "default"
    create = False
    files: Json = {}
    sets: Json = {}
    i = 0
    while i < len(rest):
        arg = rest[i]
        if arg in ("-n", "--namespace"):
            namespace, i = rest[i + 1], i + 2
        elif arg == "--create-namespace":
            create, i = True, i + 1
        elif arg in ("-f", "--values"):
            loaded = yaml.safe_load(Path(rest[i + 1]).read_text()) or {}
            files, i = merge(files, loaded), i + 2
        elif arg in ("--set", "--set-string"):
            set_value(sets, rest[i + 1], strings=arg == "--set-string")
            i += 2
        elif arg.startswith("-"):
            raise SystemExit(f"Error: the docs' helm shim does not know the flag {arg}")
        else:
            positional.append(arg)
            i += 1
    return verb, positional, namespace, create, merge(files, sets)


NO_OPENAPI = "failed to download openapi"


def _kubectl(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    from gpuslice.testing import envtest

    return subprocess.run(
        [str(envtest.assets() / "kubectl"), "--kubeconfig", os.environ["KUBECONFIG"], *args],
        input=stdin, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


def _rendered(values: Json, namespace: str) -> list[Json]:
    from tests.chart.chart_support import SETS, check_chart

    full = check_chart.deep_merge(SETS["default"], values)
    full = check_chart.deep_merge(full, {"namespaceOverride": namespace})
    result = check_chart.check_values("docs", full)
    if not result.manifests or result.problems:
        raise RuntimeError("; ".join(result.problems) or "the chart did not render")
    return list(result.manifests)


def _create_namespace(namespace: str) -> None:
    print(
        f"(docs test: the API server serves no OpenAPI v2 for Helm; namespace {namespace} made "
        "with kubectl for --create-namespace)",
        file=sys.stderr,
    )
    if _kubectl("get", "namespace", namespace).returncode != 0:
        made = _kubectl("create", "namespace", namespace)
        if made.returncode != 0:
            raise RuntimeError(made.stderr.strip())


def _without_helm(verb: str, namespace: str, create: bool, values: Json) -> None:
    """Helm's renderer and `kubectl apply` (or delete), for when Helm's install cannot
    get the OpenAPI document (see the module docstring)."""
    print(
        f"(docs test: the API server serves no OpenAPI v2 for Helm; helm {verb} done as "
        "Helm's render + kubectl apply)",
        file=sys.stderr,
    )
    manifests = yaml.safe_dump_all(_rendered(values, namespace))
    if verb == "uninstall":
        done = _kubectl("delete", "--ignore-not-found", "-f", "-", stdin=manifests)
    else:
        if create:
            _create_namespace(namespace)
        done = _kubectl("apply", "--validate=false", "-f", "-", stdin=manifests)
    if done.returncode != 0:
        raise RuntimeError(done.stderr.strip())


def main(argv: list[str]) -> int:
    from helm_sdkpy.actions import Configuration, Install, Uninstall, Upgrade

    verb, positional, namespace, create, values = parse(argv)
    config = Configuration(namespace=namespace, kubeconfig=os.environ["KUBECONFIG"])
    # a release installed without Helm (below) is upgraded and uninstalled the same way
    marker = Path(os.environ.get("SCRATCH", "/nonexistent")) / f"helm-fallback-{positional[0]}"
    try:
        try:
            if verb != "install" and marker.exists():
                raise RuntimeError(NO_OPENAPI)
            try:
                _helm(verb, positional, config, create, values, (Install, Upgrade, Uninstall))
            except Exception as exc:
                if NO_OPENAPI not in str(exc) or not create:
                    raise
                # Helm validates only the Namespace it creates against the OpenAPI document:
                # made with kubectl, the release itself is installed by Helm
                _create_namespace(namespace)
                _helm(verb, positional, config, False, values, (Install, Upgrade, Uninstall))
        except Exception as exc:
            if NO_OPENAPI not in str(exc):
                raise
            _without_helm(verb, namespace, create, values)
            if verb == "install":
                marker.touch()
    except Exception as exc:  # Helm's own error, as the helm CLI prints it
        print(f"Error: {exc}", file=sys.stderr)
        return 1
    print(f"helm {verb} {' '.join(positional)}: done")
    return 0


def _helm(
    verb: str, positional: list[str], config: Any, create: bool, values: Json,
    actions: tuple[Any, Any, Any],
) -> None:  # fmt: skip
    install, upgrade, uninstall = actions
    if verb == "install":
        release, chart = positional
        asyncio.run(
            install(config).run(release, chart, values=values, create_namespace=create, wait=False)
        )
    elif verb == "upgrade":
        release, chart = positional
        asyncio.run(upgrade(config).run(release, chart, values=values, wait=False))
    elif verb == "uninstall":
        [release] = positional
        asyncio.run(uninstall(config).run(release, wait=False))
    else:
        raise RuntimeError(f"the docs' helm shim does not run `helm {verb}`")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
