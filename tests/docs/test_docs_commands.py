"""Every command the first-hour docs tell a user to paste, run as pasted (issue 43 item 5).

The commands are read from the docs themselves: every ```console block of README.md,
docs/install.md, docs/migrating-from-nvidia.md, docs/advise.md and docs/metrics.md, and the
inline commands of the migration guide's "Order of steps" (followed verbatim, step by step).
Each block runs as one bash script (`set -e`, so an `export` or a background job carries to
the next line, as in a terminal), in a scratch directory that holds the repository's
`deploy`, `docs`, `scripts` and `tests` and this Python's venv as `.venv`:

- `gpuslice ...` runs for real (this checkout's code);
- `kubectl ...` runs against a real kube-apiserver started for the block (envtest, from
  `KUBEBUILDER_ASSETS`: a fresh cluster per block, so each block is tried as a new user
  would meet it). This API server answers 503 for the OpenAPI v2 document kubectl's
  client-side validation fetches (the project's other tests pass `--validate=false` for
  it), so `create`/`apply` refused for exactly that reason are run again with
  `--validate=false` (`KUBECTL_RETRY`); the server still decodes and admits every object;
- `helm install|upgrade|uninstall` runs through `tests/docs/helm_shim.py`, real Helm
  (helm-sdkpy) with the CLI's flag parsing, against that API server, not waiting for pods
  (no kubelet here);
- `gpuslice advise --prometheus` asks a real Prometheus holding the docs' example workload
  (`gpuslice.testing.promserver`), its URL in `$PROM`.

What a user fills in is filled in, and said here: `<agent pod>`, `<node>` (a Node created for
the block), the Prometheus URLs, `<node IP>:9400` (an agent started for the block), the
local agent's port 9400 and `/tmp/gpuslice-dp` (a free port and a scratch directory, so
parallel runs do not meet), `my-values.yaml` (NVIDIA's values from
`tests/configs/seeds/001-helm-values-time-slicing.yaml`), `values.yaml` (the one the migration
guide shows, its ```yaml block under "Order of steps"). Commands that cannot run here are
listed in `NOT_HERE` with the reason; a command neither run nor listed fails the test.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from gpuslice.testing import envtest, promserver
from gpuslice.testing.workloads import docs_example, write_openmetrics

ROOT = Path(__file__).resolve().parents[2]
DOCS = ("README.md", "docs/install.md", "docs/migrating-from-nvidia.md", "docs/advise.md",
        "docs/metrics.md")  # fmt: skip
NVIDIA_VALUES = ROOT / "tests/configs/seeds/001-helm-values-time-slicing.yaml"
AGENT_POD = "gpuslice-x7k2p"
NODE = "gpu-1"
BLOCK_TIMEOUT_S = 240

NOT_HERE: dict[str, str] = {
    r"python3 -m venv \.venv && \.venv/bin/pip install -q \. && \.venv/bin/gpuslice demo": (
        "installs from PyPI; tests/packaging builds the same wheel and tests/test_demo.py "
        "runs `gpuslice demo`"
    ),
    r"bash scripts/check": "runs every test, this one included",
    r"kubectl exec -n gpuslice <agent pod> -- gpuslice top.*": (
        "needs a running agent pod: this tier has no kubelet; `gpuslice top` runs here "
        "against a local agent (README, metrics.md)"
    ),
    r'gpuslice plugin --config-file /available-configs --node-name "\$NODE_NAME"': (
        "needs NVIDIA GPUs (NVML) and the chart's ConfigMap mount; README's local agent "
        "runs the same daemon on a simulated node"
    ),
    r"\.venv/bin/pip install --ignore-requires-python -r scripts/requirements-chart\.txt": (
        "installs from PyPI; the tools are in this venv (tests/chart needs them)"
    ),
    r"\.venv/bin/python scripts/check-chart  .*every values set": (
        "renders every values set (minutes on the shared machine); tests/chart runs the "
        "same checks per set, and the `--set per-node-configs` line below runs"
    ),
    r"echo quit \| CUDA_MPS_PIPE_DIRECTORY=.*": "needs the NVIDIA driver's MPS control program",
    r"nvidia-smi -i <index> -c DEFAULT": "needs the NVIDIA driver's nvidia-smi",
    r"make image.*": "needs a Docker engine and a registry; tests/image builds the Dockerfile",
    r"docker build .*": "needs a Docker engine; tests/image builds the Dockerfile with buildah",
    r"scripts/build-image.*": "needs root, buildah and mmdebstrap; tests/image runs it",
    r"gpuslice top --watch 2 .*": (
        "refreshes until interrupted; `gpuslice top` runs here without --watch"
    ),
}

PLOT = r".*--plot advise\.png.*"
"""`--plot` needs matplotlib, an optional extra (`gpuslice[plot]`)."""

KNOWN_BROKEN: dict[str, tuple[str, str]] = {}
"""Lines the docs still get wrong, each with the issue that fixes it and a word its error
names: the block must fail at that line with that error (the test shows the bug), then the
test is an expected failure. Once the line
is fixed its pattern no longer matches and the block must pass."""


@dataclass(frozen=True, slots=True)
class Block:
    doc: str
    number: int
    commands: tuple[str, ...]

    @property
    def name(self) -> str:
        return f"{self.doc}#{self.number}"


def _commands(block: str) -> list[str]:
    """One entry per command: continuation lines joined, comment-only and blank lines out."""
    out: list[str] = []
    pending = ""
    for line in block.splitlines():
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1].rstrip() + " "
            continue
        out.append((pending + line.strip()).strip())
        pending = ""
    return out


def blocks() -> list[Block]:
    found: list[Block] = []
    for doc in DOCS:
        text = (ROOT / doc).read_text()
        for n, body in enumerate(re.findall(r"```console\n(.*?)```", text, flags=re.S), 1):
            found.append(Block(doc, n, tuple(_commands(body))))
        if doc.endswith("migrating-from-nvidia.md"):
            steps = text.split("## Order of steps", 1)[1].split("\n## ", 1)[0]
            inline = [
                c
                for c in re.findall(r"`((?:helm|kubectl) [^`]+)`", steps)
                if len(c.split()) >= 3 and "..." not in c
            ]
            found.append(Block(doc, 0, tuple(inline)))
    return found


def migration_values() -> str:
    """The `values.yaml` the migration guide's step 1 installs with: its ```yaml block under
    "Order of steps" (tests/real_node/test_migration_guide_on_a_real_kubelet.py follows the
    same steps on a real kubelet)."""
    text = (ROOT / "docs/migrating-from-nvidia.md").read_text()
    steps = text.split("## Order of steps", 1)[1].split("\n## ", 1)[0]
    [values] = re.findall(r"```yaml\n(.*?)```", steps, flags=re.S)
    return str(values)


def not_here(command: str) -> str | None:
    for pattern, why in NOT_HERE.items():
        if re.fullmatch(pattern, command):
            return why
    if re.fullmatch(PLOT, command) and importlib.util.find_spec("matplotlib") is None:
        return "the plot extra (matplotlib) is not installed here; tests/core/advise runs --plot"
    return None


def known_broken(command: str) -> tuple[str, str] | None:
    return next((w for p, w in KNOWN_BROKEN.items() if re.fullmatch(p, command)), None)


def _runs(block: Block) -> list[str]:
    return [c for c in block.commands if not_here(c) is None]


def _fill(command: str, block: Block) -> str:
    filled = command.replace("<agent pod>", AGENT_POD).replace("<node>", NODE)
    for url in ("http://prometheus.monitoring:9090", "http://prometheus:9090"):
        filled = filled.replace(url, '"$PROM"')
    filled = filled.replace("<node IP>:9400", "127.0.0.1:$AGENT_PORT")
    if any("gpuslice plugin --node sim:" in c for c in block.commands):
        filled = filled.replace("9400", "$AGENT_PORT").replace("/tmp/gpuslice-dp", "$SCRATCH/dp")
    return filled


def _script(block: Block) -> str:
    lines = ["set -e"]
    for n, command in enumerate(block.commands):
        why = not_here(command)
        if why is not None:
            lines.append(f": not runnable here: {json.dumps(why)}")
            continue
        lines.append(f"echo '@@ {n}' >&2")
        lines.append(_fill(command, block))
    return "\n".join(lines) + "\n"


# -- what a block needs ---------------------------------------------------------------------


def _needs_api(block: Block) -> bool:
    return any(c.split()[0] in ("kubectl", "helm") for c in _runs(block))


def _needs_prometheus(block: Block) -> bool:
    return any("--prometheus" in c for c in _runs(block))


def _needs_agent(block: Block) -> bool:
    return any("<node IP>" in c for c in _runs(block))


def _workdir(tmp: Path) -> Path:
    work = tmp / "work"
    work.mkdir()
    for name in ("deploy", "docs", "scripts", "tests"):
        (work / name).symlink_to(ROOT / name)
    (work / ".venv").symlink_to(Path(sys.prefix))
    shutil.copy(NVIDIA_VALUES, work / "my-values.yaml")
    (work / "values.yaml").write_text(migration_values())
    shim = tmp / "bin" / "helm"
    shim.parent.mkdir()
    shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m tests.docs.helm_shim "$@"\n')
    shim.chmod(0o755)
    with contextlib.suppress(envtest.EnvtestUnavailable):
        kubectl = tmp / "bin" / "kubectl"
        kubectl.write_text(KUBECTL_RETRY.format(real=envtest.assets() / "kubectl"))
        kubectl.chmod(0o755)
    return work


KUBECTL_RETRY = """#!/bin/bash
# kubectl as pasted; once more with --validate=false only when this tier's API server
# failed kubectl's client-side validation (its OpenAPI v2 answers 503), and saying so
err=$(mktemp)
"{real}" "$@" 2>"$err" && {{ cat "$err" >&2; rm -f "$err"; exit 0; }}
code=$?
if grep -q 'error validating data: the server is currently unable to handle' "$err"; then
    echo "(docs test: client-side validation unavailable here; again with --validate=false)" >&2
    rm -f "$err"
    exec "{real}" "$@" --validate=false
fi
cat "$err" >&2; rm -f "$err"; exit $code
"""


def _kubectl(plane: envtest.ControlPlane, *args: str, stdin: str | None = None) -> None:
    done = plane.kubectl(*args, stdin=stdin)
    assert done.returncode == 0, done.stderr


CLUSTER_POLICY_CRD = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "clusterpolicies.nvidia.com"},
    "spec": {
        "group": "nvidia.com",
        "names": {
            "kind": "ClusterPolicy",
            "plural": "clusterpolicies",
            "singular": "clusterpolicy",
        },
        "scope": "Cluster",
        "versions": [
            {
                "name": "v1",
                "served": True,
                "storage": True,
                "schema": {
                    "openAPIV3Schema": {
                        "type": "object",
                        "x-kubernetes-preserve-unknown-fields": True,
                    }
                },
            }
        ],
    },
}


def _given(block: Block, plane: envtest.ControlPlane, env: dict[str, str], work: Path) -> None:
    """What the block takes as already there, made on the block's fresh cluster."""
    text = " ".join(block.commands)
    for node in (NODE, "gpu-node-1"):
        if node in _fill(text, block):
            _kubectl(plane, "create", "--validate=false", "-f", "-", stdin=json.dumps(
                {"apiVersion": "v1", "kind": "Node", "metadata": {"name": node}}))  # fmt: skip
    if "clusterpolicies.nvidia.com/cluster-policy" in text:
        # the GPU Operator's CRD, stood in by one that keeps any spec, and its one object
        _kubectl(
            plane, "create", "--validate=false", "-f", "-", stdin=json.dumps(CLUSTER_POLICY_CRD)
        )
        for _ in range(50):
            if plane.kubectl("get", "clusterpolicies.nvidia.com").returncode == 0:
                break
            time.sleep(0.1)
        _kubectl(plane, "create", "--validate=false", "-f", "-", stdin=json.dumps({
            "apiVersion": "nvidia.com/v1", "kind": "ClusterPolicy",
            "metadata": {"name": "cluster-policy"},
            "spec": {"devicePlugin": {"enabled": True}, "gfd": {"enabled": True}}}))  # fmt: skip
    first = block.commands[0]
    if first.startswith(("helm upgrade", "helm uninstall")):
        done = subprocess.run(
            ["helm", "install", "gpuslice", "deploy/helm/gpuslice", "-n", "gpuslice",
             "--create-namespace"],
            cwd=work, env=env, capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr


@contextlib.contextmanager
def _prometheus(tmp: Path) -> Iterator[str]:
    why = promserver.missing()
    if why is not None:
        pytest.skip(f"no Prometheus for the advise commands: {why}")
    samples = tmp / "recent.om"
    with samples.open("w") as out:  # the docs' workload, ending now: `--since 7d` finds it
        write_openmetrics([docs_example(end=time.time() - 60)], out)
    promserver.create_blocks(samples, tmp / "tsdb")
    (tmp / "prom").mkdir()
    with promserver.serving(tmp / "tsdb", tmp / "prom") as url:
        yield url


@contextlib.contextmanager
def _agent(tmp: Path, port: int, env: dict[str, str]) -> Iterator[None]:
    (tmp / "agent-dp").mkdir()
    command = [sys.executable, "-m", "gpuslice", "plugin", "--node", "sim:2xt4",
               "--config-file", str(ROOT / "tests/configs/seeds/000-default-time-slicing-4.yaml"),
               "--device-plugin-path", str(tmp / "agent-dp"), "--kubelet-socket", "",
               "--labels-mode", "off", "--metrics-port", str(port)]  # fmt: skip
    log = tmp / "agent.log"
    with log.open("w") as out:
        proc = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        while True:
            with contextlib.suppress(OSError):
                urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1).close()
                break
            assert proc.poll() is None, log.read_text()
            assert time.monotonic() < deadline, "the agent did not answer /healthz"
            time.sleep(0.1)
        yield
    finally:
        proc.terminate()
        proc.wait(timeout=30)


# -- the tests ------------------------------------------------------------------------------


def test_the_docs_commands_are_found() -> None:
    everything = [c for b in blocks() for c in b.commands]
    assert "gpuslice advise --samples docs/examples/node-1.om -o json" in everything
    assert any(
        c.startswith("kubectl label node <node> gpuslice.io/migrate=true") for c in everything
    )
    assert "gpuslice describe --config-file tests/configs/seeds/001-a100-mig-single.yaml " \
        "--node 'sim:1xa100-80gb/mig=1g.10gb*7' -o json" in everything  # fmt: skip
    # every rule for commands not run here still names a command the docs hold
    for pattern in NOT_HERE:
        assert any(re.fullmatch(pattern, c) for c in everything), f"stale rule: {pattern}"


def test_the_shipped_samples_file_is_what_its_script_writes(tmp_path: Path) -> None:
    """docs/examples/node-1.om is made by scripts/advise-samples; a hand edit would make
    advise.md's numbers come from a file nobody can make again."""
    import io

    out = io.StringIO()
    write_openmetrics([docs_example()], out)
    assert (ROOT / "docs/examples/node-1.om").read_text() == out.getvalue()


@pytest.mark.timeout(BLOCK_TIMEOUT_S + 60)
@pytest.mark.parametrize("block", blocks(), ids=lambda b: b.name)
def test_each_docs_block_runs_as_pasted(block: Block, tmp_path: Path) -> None:
    runs = _runs(block)
    if not runs:
        reasons = "; ".join(f"{c}: {not_here(c)}" for c in block.commands)
        pytest.skip(f"nothing in this block runs here ({reasons})")
    work = _workdir(tmp_path)
    env = {k: v for k, v in os.environ.items() if k not in ("KUBECONFIG", "VIRTUAL_ENV", "PROM")}
    env["PYTHONPATH"] = f"{ROOT}:{ROOT / 'src'}"
    # README's blocks start from a fresh shell (the tour puts the venv on PATH itself);
    # the other docs take gpuslice as installed
    installed = [] if block.doc == "README.md" else [str(Path(sys.executable).parent)]
    env["PATH"] = os.pathsep.join([str(tmp_path / "bin"), *installed, env.get("PATH", "")])
    if block.doc == "README.md":
        env["PATH"] = os.pathsep.join(
            p for p in env["PATH"].split(os.pathsep) if Path(p) != Path(sys.executable).parent
        )
    env["SCRATCH"] = str(tmp_path)
    env["AGENT_PORT"] = str(envtest.free_port())
    env["COLUMNS"] = "140"
    with contextlib.ExitStack() as stack:
        if _needs_api(block):
            try:
                plane = stack.enter_context(envtest.running(scheduler=False))
            except envtest.EnvtestUnavailable as exc:
                pytest.skip(f"no real API server for kubectl/helm: {exc}")
            env["KUBECONFIG"] = str(plane.kubeconfig)
            _given(block, plane, env, work)
        if _needs_prometheus(block):
            env["PROM"] = stack.enter_context(_prometheus(tmp_path))
        if _needs_agent(block):
            stack.enter_context(_agent(tmp_path, int(env["AGENT_PORT"]), env))
        done = subprocess.run(
            ["bash", "-c", _script(block)],
            cwd=work, env=env, capture_output=True, text=True, timeout=BLOCK_TIMEOUT_S,
            check=False,
        )  # fmt: skip
    markers = re.findall(r"^@@ (\d+)$", done.stderr, flags=re.M)
    last = block.commands[int(markers[-1])] if markers else "(none)"
    broken = [(c, b) for c in block.commands if (b := known_broken(c)) is not None]
    if broken:
        command, (why, error) = broken[0]
        failed_there = done.returncode != 0 and last == command
        assert failed_there, f"{command!r} is listed as broken ({why}) but the block passed it"
        assert error in done.stderr.split(f"@@ {block.commands.index(command)}")[-1], (
            f"{command!r} failed, but not for the listed reason ({why}):\n{done.stderr[-2000:]}"
        )
        pytest.xfail(f"{block.name}: {why}")
    assert done.returncode == 0, (
        f"{block.name}: `{last}` failed (exit {done.returncode})\n"
        f"stdout:\n{done.stdout[-3000:]}\nstderr:\n{done.stderr[-3000:]}"
    )


def test_the_helm_shim_types_set_values_as_helm_does() -> None:
    from tests.docs.helm_shim import parse

    *_, values = parse(["install", "r", "c", "--set", r"nodeSelector.gpuslice\.io/migrate=true"])
    assert values == {"nodeSelector": {"gpuslice.io/migrate": True}}
    *_, values = parse(
        ["install", "r", "c", "--set-string", r"nodeSelector.gpuslice\.io/migrate=true"]
    )
    assert values == {"nodeSelector": {"gpuslice.io/migrate": "true"}}
    *_, values = parse(["upgrade", "r", "c", "--set", "a.b=1,c=x", "--set", "d=null"])
    assert values == {"a": {"b": 1}, "c": "x", "d": None}
