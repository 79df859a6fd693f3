"""`gpuslice plugin`: the node daemon, with NVIDIA's flag and environment variable names.

A flag or variable that is set overrides the config file (NVIDIA's precedence); one left at
its default does not, so the file's value (or NVIDIA's default) applies.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import click
from click.core import ParameterSource

from gpuslice import __version__
from gpuslice.agent.build import build_agent
from gpuslice.agent.configs import load_config
from gpuslice.agent.front_ends import front_end_of
from gpuslice.agent.knobs import KnobField, knob, knobs
from gpuslice.agent.node_lock import holding_the_node
from gpuslice.agent.runner import Agent
from gpuslice.agent.settings import (
    AgentSettings,
    CapsSettings,
    ConfigFlags,
    DraSettings,
    GuardSettings,
)
from gpuslice.agent.watchdog import LoopWatchdog, install_shutdown_signals
from gpuslice.cli.common import knob_option
from gpuslice.cli.errors import BadInput, reports_errors
from gpuslice.cli.logsetup import setup_logging
from gpuslice.core.errors import GpusliceError
from gpuslice.core.jsontypes import Json
from gpuslice.logs import get_logger
from gpuslice.ports import BackendError

SHUTDOWN_GRACE_S = 20.0
"""Hard-exit deadline after SIGTERM: shorter than a pod's default 30 s grace period, so the
kubelet never has to SIGKILL us with sockets left behind."""


@dataclass(frozen=True, slots=True)
class DaemonFlags:
    """The process's own switches: how it logs, which front end, how long it may take to
    stop. Not agent settings: they choose between them (`--dra`) or act before them."""

    log_format: str = knob(
        "text",
        "--log-format",
        env="LOG_FORMAT",
        help="Log lines as key=value text or one JSON object each.",
        chart="logFormat",
        type=click.Choice(["text", "json"]),
        show_default=True,
    )
    verbose: bool = knob(
        False,
        "-v",
        "--verbose",
        is_flag=True,
        help="Log at debug level (libraries' request lines included).",
    )
    no_labels: bool = knob(False, "--no-labels", is_flag=True, help="Do not write node labels.")
    dra: bool = knob(
        False,
        "--dra/--no-dra",
        env="DRA",
        chart="dra.enabled",
        help="Serve GPUs as a DRA driver instead of device plugins (docs/dra.md).",
    )
    shutdown_grace_s: float = knob(
        SHUTDOWN_GRACE_S,
        "--shutdown-grace",
        "shutdown_grace_s",
        env="GPUSLICE_SHUTDOWN_GRACE",
        type=click.FloatRange(min=0.1),
        hidden=True,
        help="Seconds after SIGTERM before a hard exit (tests shorten it).",
    )


GROUPS: tuple[type, ...] = (
    AgentSettings,
    ConfigFlags,
    GuardSettings,
    CapsSettings,
    DraSettings,
    DaemonFlags,
)
"""Every settings group whose knobs make up `gpuslice plugin`'s options."""


def _fields() -> dict[type, list[tuple[KnobField, click.Option | None]]]:
    return {
        group: [(f, knob_option(f) if f.knob.flags else None) for f in knobs(group)]
        for group in GROUPS
    }


FIELDS = _fields()
"""Each group's knobs with the click option generated from each (None: environment only)."""
_KNOB_OF_OPTION = {
    str(option.name): f.knob
    for group in GROUPS
    for f, option in FIELDS[group]
    if option is not None
}


def _values(group: type, params: Mapping[str, Any]) -> dict[str, Any]:
    """The group's field values from the parsed options; knobs without a flag are read
    from the environment here, the one place the daemon reads its variables."""
    out: dict[str, Any] = {}
    for f, option in FIELDS[group]:
        if option is None:
            assert f.knob.env is not None
            given = os.environ.get(f.knob.env)
            if given is None:
                out[f.name] = f.default
                continue
        else:
            given = params[str(option.name)]
        try:
            out[f.name] = f.value(given)
        except (ValueError, GpusliceError) as exc:
            raise BadInput(f"{f.knob.names()}: {exc}") from None
    return out


def _overrides(ctx: click.Context) -> dict[str, object]:
    """Config paths of NVIDIA's flags that were set: a flag left at its default does not
    override the file."""
    out: dict[str, object] = {}
    values = _values(ConfigFlags, ctx.params)
    for f, option in FIELDS[ConfigFlags]:
        assert option is not None
        assert f.knob.overrides is not None
        source = ctx.get_parameter_source(str(option.name))
        if source in (ParameterSource.COMMANDLINE, ParameterSource.ENVIRONMENT):
            out[f.knob.overrides] = values[f.name]
    return out


def _guard_settings(params: Mapping[str, Any]) -> GuardSettings:
    return GuardSettings(**_values(GuardSettings, params))


def _labels_mode(settings: AgentSettings, daemon: DaemonFlags) -> str:
    """A simulated node writes its labels only where told (`--labels-file`): the default
    path is the real NFD directory, and simulated labels there would relabel a real node."""
    if daemon.no_labels:
        return "off"
    mode = settings.labels_mode
    if mode == "file" and settings.labels_file is None and settings.node != "nvml":
        get_logger("gpuslice").warning(
            "labels-off",
            reason="simulated-node",
            node=settings.node,
            hint="pass --labels-file to write them",
        )
        return "off"
    return mode


def settings_from_cli(ctx: click.Context) -> tuple[AgentSettings, DaemonFlags]:
    """The settings the parsed command line and environment give, with the rules between
    settings applied: the kubelet socket's default under the plugin directory, `--no-labels`
    and a simulated node's labels, `--dra` choosing DRA's group, `AgentSettings.problems`."""
    params = ctx.params
    daemon = DaemonFlags(**_values(DaemonFlags, params))
    values = _values(AgentSettings, params)
    socket = values["kubelet_socket"]
    if socket is None:
        values["kubelet_socket"] = values["plugin_dir"] / "kubelet.sock"
    else:
        values["kubelet_socket"] = Path(socket) if socket else None
    values["memory_guard"] = _guard_settings(params)
    values["memory_caps"] = CapsSettings(**_values(CapsSettings, params))
    values["dra"] = DraSettings(**_values(DraSettings, params)) if daemon.dra else None
    values["overrides"] = _overrides(ctx)
    settings = AgentSettings(**values)
    settings = replace(settings, labels_mode=_labels_mode(settings, daemon))
    for problem in settings.problems():
        raise BadInput(problem)
    return settings, daemon


@reports_errors
def _plugin(ctx: click.Context) -> None:
    """Run the device plugin daemon on this node."""
    setup_logging(ctx.params["log_format"], verbose=ctx.params["verbose"])
    settings, daemon = settings_from_cli(ctx)
    get_logger("gpuslice").info(
        "starting",
        version=__version__,
        mode=front_end_of(settings).name,
        node=settings.node,
        node_name=settings.node_name or None,
    )
    # the watchdog learns from the loop's own selector when the loop waits (agent.watchdog)
    watchdog = LoopWatchdog()
    with asyncio.Runner(loop_factory=watchdog.loop_factory) as runner:
        runner.run(_serve(settings, watchdog, daemon.shutdown_grace_s))


class _Daemon(click.Command):
    """A command whose options are the settings' knobs: it hands the parsed context to
    `settings_from_cli` instead of spreading 60 values into keyword arguments."""

    def invoke(self, ctx: click.Context) -> None:
        _plugin(ctx)

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        """A bad value (from a flag, its variable, or the chart that set the variable) is
        one `error:` line naming all three, like every other start-up error."""
        try:
            return super().parse_args(ctx, args)
        except click.BadParameter as exc:
            if exc.param is None or exc.param.name not in _KNOB_OF_OPTION:
                raise
            raise BadInput(f"{_KNOB_OF_OPTION[exc.param.name].names()}: {exc.message}") from None


plugin = _Daemon(
    "plugin",
    params=[option for group in GROUPS for _f, option in FIELDS[group] if option is not None],
    help=_plugin.__doc__,
)


async def _serve(
    settings: AgentSettings, watchdog: LoopWatchdog, grace_s: float = SHUTDOWN_GRACE_S
) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    # a real signal handler, not loop.add_signal_handler: it must work while the loop is
    # blocked (agent.watchdog says why)
    install_shutdown_signals(loop, stop, grace_s)
    watchdog.start()
    try:
        await _run_agent(settings, stop)
    finally:
        watchdog.stop()


async def _run_agent(settings: AgentSettings, stop: asyncio.Event) -> None:
    # one agent acts on a node at a time: nothing below runs before the lock is held
    async with holding_the_node(settings, stop) as held:
        if held:
            await _run_holding(settings, stop)
        else:
            get_logger("gpuslice").info("stopped", message="while waiting for the node lock")


async def _run_holding(settings: AgentSettings, stop: asyncio.Event) -> None:
    agent: Agent | None = None
    try:
        try:
            async with build_agent(settings) as agent:
                await agent.run(stop)
        except BaseExceptionGroup as group:
            raise _the_expected(group) from None
    except (GpusliceError, BackendError) as exc:
        if (agent is not None and agent.started.is_set()) or _fail_on_init_error(settings):
            raise
        # NVIDIA's behaviour with failOnInitError=false: stay up, so a DaemonSet pod on a
        # node without a usable GPU does not crash-loop; the log says why nothing is served.
        get_logger("gpuslice").error(
            "init-failed",
            error=str(exc),
            failOnInitError=False,
            message="waiting indefinitely",
        )
        await stop.wait()
    get_logger("gpuslice").info("stopped")


def _the_expected(group: BaseExceptionGroup[BaseException]) -> BaseException:
    """The one error a user can act on (a port taken, a bad config) when that is all the
    agent's task group ended with; anything else stays the group, traceback and all."""
    leaves: list[BaseException] = []
    pending: list[BaseException] = [group]
    while pending:
        exc = pending.pop()
        if isinstance(exc, BaseExceptionGroup):
            pending.extend(exc.exceptions)
        else:
            leaves.append(exc)
    if leaves and all(isinstance(e, GpusliceError | BackendError) for e in leaves):
        return leaves[0]
    return group


def _fail_on_init_error(settings: AgentSettings) -> bool:
    try:
        return bool(load_config(settings).config.flags.fail_on_init_error)
    except GpusliceError:
        return True


CHART_KNOBS = "knobs.json"
"""The file in the chart's directory that `chart_knobs` writes (`scripts/gen-chart-knobs`)."""
_BOOL = r"^\s*(?i:1|0|true|false|t|f|yes|no|y|n|on|off)?\s*$"
_INT = r"^\s*[+-]?[0-9]+\s*$"
_FLOAT = r"^\s*[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?\s*$"


def _check_of(option: click.Option) -> Json:
    """What click checks of the option's value, as the chart's templates can check it
    (Go's regexp and Sprig's comparisons); {} where click takes any text."""
    kind = option.type
    if isinstance(kind, click.Choice):
        return {"enum": [str(c) for c in kind.choices]}
    if isinstance(kind, click.types._NumberRangeBase):
        check: Json = {
            "pattern": _INT if isinstance(kind, click.IntRange) else _FLOAT,
            "min": kind.min,
            "max": kind.max,
            "minOpen": kind.min_open,
            "maxOpen": kind.max_open,
        }
        return {k: v for k, v in check.items() if v is not None and v is not False}
    if isinstance(kind, click.types.BoolParamType):  # flags too: their variables are read so
        return {"pattern": _BOOL}
    if isinstance(kind, click.types.IntParamType):
        return {"pattern": _INT}
    if isinstance(kind, click.types.FloatParamType):
        return {"pattern": _FLOAT}
    return {}


def chart_knobs() -> dict[str, Json]:
    """Each variable `gpuslice plugin` reads, with the flag, the chart value that sets it
    (if any) and what click checks of its value: the chart refuses an `extraEnv` entry the
    agent would refuse at start (`gpuslice.validateExtraEnv`), from this one source."""
    out: dict[str, Json] = {}
    for group in GROUPS:
        for f, option in FIELDS[group]:
            if f.knob.env is None:
                continue
            entry: Json = {"flag": f.knob.flag or ""}
            if f.knob.chart:
                entry["chart"] = f.knob.chart
            if option is not None:
                entry |= _check_of(option)
            out[f.knob.env] = entry
    return dict(sorted(out.items()))


_TYPE_OF_PATTERN = {_BOOL: "boolean", _INT: "integer", _FLOAT: "number"}
_SCHEMA_BOUND = {
    ("min", False): "minimum",
    ("min", True): "exclusiveMinimum",
    ("max", False): "maximum",
    ("max", True): "exclusiveMaximum",
}


def chart_schema() -> dict[str, Json]:
    """Each chart value that sets a knob's variable, with the JSON schema of what the agent
    takes in that variable (the value's type, a choice's values, a range's bounds), from the
    same checks as `chart_knobs`: what the chart's `values.schema.json` entry must say, so
    `helm install` refuses what the agent would refuse at start."""
    out: dict[str, Json] = {}
    for group in GROUPS:
        for f, option in FIELDS[group]:
            if f.knob.chart is None:
                continue
            check = {} if option is None else _check_of(option)
            entry: Json = {}
            if "enum" in check:
                entry["enum"] = check["enum"]
            else:
                entry["type"] = _TYPE_OF_PATTERN.get(check.get("pattern", ""), "string")
            for end in ("min", "max"):
                if end in check:
                    entry[_SCHEMA_BOUND[end, bool(check.get(f"{end}Open"))]] = check[end]
            out[f.knob.chart] = entry
    return dict(sorted(out.items()))
