"""Docs that said one thing while another doc or the code did another (issue 43 item 5):
each check reads the doc's own table or block and holds it to the code or the rendered
chart, so the two cannot drift apart again."""

from __future__ import annotations

import re
from pathlib import Path

from gpuslice.agent.settings import AgentSettings
from gpuslice.core.config import parse_config

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"


def table_rows(text: str, heading: str) -> list[list[str]]:
    """The cells of every row of the first table under `heading` (a `#` line)."""
    start = text.index(heading)
    rows: list[list[str]] = []
    started = False
    for line in text[start:].splitlines()[1:]:
        if line.startswith("|"):
            started = True
            if not set(line.strip()) <= set("|-: "):  # not the separator row
                rows.append([c.strip() for c in line.strip().strip("|").split(" | ")])
        elif started:
            break
    return rows[1:]  # without the header


def console_blocks(text: str) -> list[str]:
    return re.findall(r"```console\n(.*?)```", text, flags=re.S)


def test_the_privileges_table_names_what_an_enforcing_guard_adds() -> None:
    from tests.chart.chart_support import container_of, one, render

    rendered = render(memoryGuard={"mode": "enforce"})
    assert rendered.ok, rendered.problems
    assert one(rendered, "DaemonSet")["spec"]["template"]["spec"]["hostPID"] is True
    assert container_of(rendered)["securityContext"]["capabilities"]["add"] == ["KILL"]

    rows = table_rows((DOCS / "install.md").read_text(), "### Privileges")
    granted = [row[1] for row in rows if "`memoryGuard.mode: enforce`" in row[0]]
    assert granted, "no row for memoryGuard.mode: enforce in install.md's privileges table"
    assert "host PID namespace" in granted[0]
    assert "`CAP_KILL`" in granted[0]


def test_the_migration_guide_offers_dynamic_mig_and_the_cdi_hook_the_code_has() -> None:
    # what the code has: the config's flag and the agent's hook setting
    config = parse_config("version: v1\nflags:\n  dynamicMig:\n    devices: all\n")
    assert config.flags.dynamic_mig
    assert AgentSettings().memory_caps.hook_path == "/usr/bin/nvidia-cdi-hook"

    text = (DOCS / "migrating-from-nvidia.md").read_text()
    rows = {r[0]: r[1] for r in table_rows(text, "### Kubelet plugin flags")}
    rows |= {r[0]: r[1] for r in table_rows(text, "### Feature gates")}
    [hook] = [a for k, a in rows.items() if k.startswith("`--nvidia-cdi-hook-path`")]
    [dynamic] = [a for k, a in rows.items() if k.startswith("`DynamicMIG`")]
    for answer in (hook, dynamic):
        assert not answer.startswith("not offered"), answer
    assert "--memory-caps-hook-path" in hook
    assert "flags.dynamicMig" in dynamic


def test_strategies_say_how_time_sliced_pods_are_held_to_their_memory() -> None:
    text = (DOCS / "strategies.md").read_text()
    [row] = [r for r in table_rows(text, "# Sharing strategies") if r[0] == "time-slicing"]
    memory = row[2]
    assert memory != "no"
    assert "caps" in memory
    assert "memory guard" in memory
    for words in ("memory caps", "memory guard", "DRA mode"):
        assert words in text, words


def test_install_creates_each_namespace_before_putting_anything_in_it() -> None:
    """A block that puts an object into a namespace creates the namespace first, as a
    fresh cluster needs (helm's --create-namespace or kubectl create namespace)."""
    problems: list[str] = []
    for doc in ("install.md", "migrating-from-nvidia.md"):
        for block in console_blocks((DOCS / doc).read_text()):
            made: set[str] = set()
            for line in block.splitlines():
                ns = re.search(r"-n (\S+)", line)
                if re.match(r"kubectl create namespace (\S+)", line):
                    made.add(line.split()[3])
                elif "helm install" in line and ns and "--create-namespace" in line:
                    made.add(ns.group(1))
                elif re.match(r"kubectl (create|apply)\b", line) and ns and ns.group(1) not in made:
                    problems.append(f"{doc}: {line}: namespace {ns.group(1)} not created")
    assert not problems, "\n".join(problems)
