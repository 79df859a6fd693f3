"""`gpuslice` command line: plugin daemon, describe, labels, demo, top, advise.

Bad input (config, node spec, flags) is reported on stderr as one readable message with
exit code 2, never a traceback.
"""

from __future__ import annotations

import importlib

import click

from gpuslice import __version__

_COMMANDS = {
    "advise": ("gpuslice.cli.advise", "advise_command"),
    "describe": ("gpuslice.cli.describe", "describe_command"),
    "labels": ("gpuslice.cli.labels", "labels"),
    "plugin": ("gpuslice.cli.plugin", "plugin"),
    "demo": ("gpuslice.cli.demo", "demo"),
    "top": ("gpuslice.cli.top", "top"),
}
"""Subcommand -> (module, attribute), imported only when that subcommand is used: the
daemon (`plugin`) runs for the node's lifetime, and importing the demo's emulators and
scenarios with it kept about 7 MiB of modules resident that it never runs."""


class _LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(super().list_commands(ctx)) | set(_COMMANDS))

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        known = super().get_command(ctx, cmd_name)
        if known is not None or cmd_name not in _COMMANDS:
            return known
        module, attr = _COMMANDS[cmd_name]
        command = getattr(importlib.import_module(module), attr)
        assert isinstance(command, click.Command)
        self.add_command(command, cmd_name)
        return command


@click.group(cls=_LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "-V", "--version", prog_name="gpuslice")
def main() -> None:
    """GPU sharing for Kubernetes: a kubelet device plugin with time-slicing, MPS and MIG."""
