"""The ``python -m pipeline`` command line: one click group, one module per area of commands."""

from __future__ import annotations

import click

from pipeline.build_cli import COMMANDS as BUILD_COMMANDS
from pipeline.ops import COMMANDS as OPS_COMMANDS
from pipeline.render_cli import render_mpijob, render_trainjob
from pipeline.serve_cli import COMMANDS as SERVE_COMMANDS


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def cli() -> None:
    """Compile, run locally, render the cluster job, and operate the pipeline on a KFP cluster."""


for _command in BUILD_COMMANDS:  # compile, run-local
    cli.add_command(_command)
cli.add_command(render_mpijob)
cli.add_command(render_trainjob)
for _command in OPS_COMMANDS:  # upload, submit, schedule, version-name
    cli.add_command(_command)
for _command in SERVE_COMMANDS:  # render-inferenceservice, sync-serving
    cli.add_command(_command)


def main() -> int:
    """Entry point; returns the process exit code."""
    try:
        cli.main(standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        return 1
    except click.ClickException as exc:
        exc.show()
        return exc.exit_code
    except SystemExit as exc:
        return int(exc.code or 0)
    return 0
