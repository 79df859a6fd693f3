"""`gpuslice` command line: plugin daemon, describe, labels, demo, top.

Bad input (config, node spec, flags) is reported on stderr as one readable message with
exit code 2, never a traceback.
"""

from __future__ import annotations

import click

from gpuslice import __version__


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="gpuslice")
def main() -> None:
    """GPU sharing for Kubernetes: a kubelet device plugin with time-slicing, MPS and MIG."""


def _register() -> None:
    from gpuslice.cli import demo, describe, labels, plugin, top

    main.add_command(describe.describe_command)
    main.add_command(labels.labels)
    main.add_command(plugin.plugin)
    main.add_command(demo.demo)
    main.add_command(top.top)


_register()
