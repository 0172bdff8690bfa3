"""The ``python -m pipeline`` command line: one click group. Compiling, running locally and the
parameters page are here; rendering the cluster jobs, operating on KFP and serving have a
module each (`pipeline.render_cli`, `pipeline.ops`, `pipeline.serve_cli`)."""

from __future__ import annotations

import click

from components.common import defaults
from components.data_prep.step import PREP_PARAMETERS
from components.register.step import REGISTER_PARAMETERS
from components.train.config import PIPELINE_TRAIN_PARAMETERS
from pipeline.cli_options import declared_options
from pipeline.ops import COMMANDS as OPS_COMMANDS
from pipeline.render_cli import render_mpijob, render_trainjob
from pipeline.serve_cli import COMMANDS as SERVE_COMMANDS


@click.command("compile")
@click.option("--output", default="build/pipeline.yaml", show_default=True, help="YAML to write")
@click.option("--image-registry", help=f"[default: {defaults.DEFAULT_IMAGE_REGISTRY}]")
@click.option("--image-tag", help=f"[default: the package version, {defaults.PACKAGE_VERSION}]")
def compile_command(output: str, image_registry: str | None, image_tag: str | None) -> None:
    """Compile the pipeline into one YAML file (upload it in the KFP UI as it is)."""
    from pipeline.build import compile_pipeline

    click.echo(f"pipeline: {compile_pipeline(output, image_registry, image_tag)}")


@click.command("run-local")
@declared_options([*PIPELINE_TRAIN_PARAMETERS, *PREP_PARAMETERS, *REGISTER_PARAMETERS])
@click.option("--root", default="runs", show_default=True, help="where runs and the registry go")
@click.option("--runner", type=click.Choice(["subprocess", "docker"]), default="subprocess",
              show_default=True, help="subprocess: every step in this environment; docker: every "
              "step in its image (build them with `make images-local`)")  # fmt: skip
@click.option("--image-registry", default=defaults.LOCAL_IMAGE_REGISTRY, show_default=True,
              help="with --runner docker: where the step images come from")  # fmt: skip
@click.option("--image-tag", default=defaults.LOCAL_IMAGE_TAG, show_default=True)
def run_local_command(root: str, runner: str, image_registry: str, image_tag: str,
                      **params: object) -> None:  # fmt: skip
    """Run the whole pipeline on this machine (kfp.local, horovodrun, local disk)."""
    from pipeline.local_run import RunFailed, run_pipeline_locally

    if not params["registry_root"]:  # run_pipeline_locally's default: under ROOT
        del params["registry_root"]
    images = (image_registry, image_tag) if runner == "docker" else None
    try:
        run = run_pipeline_locally(root, docker_images=images, **params)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from exc
    except RunFailed as exc:  # the console ends with its FAILED line and the log's path
        raise SystemExit(1) from exc
    click.echo("=" * 80)
    click.echo(f"kfp-horovod local run finished in {run.wall_seconds:.0f} s")
    click.echo("\n".join(run.report_lines()))


@click.command("parameters")
def parameters_command() -> None:
    """Print docs/parameters.md: every pipeline parameter, from its declaration."""
    from pipeline.checks import parameters_markdown

    click.echo(parameters_markdown(), nl=False)


@click.group(
    context_settings={"help_option_names": ["-h", "--help"]},
    commands=[compile_command, run_local_command, parameters_command, render_mpijob,
              render_trainjob, *OPS_COMMANDS, *SERVE_COMMANDS],
)  # fmt: skip
def cli() -> None:
    """Compile, run locally, render the cluster job, and operate the pipeline on a KFP cluster."""
