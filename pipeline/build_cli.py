"""``python -m pipeline compile`` and ``python -m pipeline run-local``."""

from __future__ import annotations

import click

from components.common import defaults
from pipeline.cli_options import lr_scaling_option, min_workers_option, model_options


@click.command("compile")
@click.option(
    "--output", default="build/pipeline.yaml", show_default=True, help="YAML file to write"
)
@click.option("--image-registry", default=None, help=f"default {defaults.DEFAULT_IMAGE_REGISTRY}")
@click.option(
    "--image-tag", default=None, help=f"default the package version, {defaults.PACKAGE_VERSION}"
)
def compile_command(output: str, image_registry: str | None, image_tag: str | None) -> None:
    """Compile the pipeline into one YAML file (upload it in the KFP UI as it is)."""
    from pipeline.build import compile_pipeline

    path = compile_pipeline(output, image_registry, image_tag)
    click.echo(f"pipeline: {path}")


@click.command("run-local")
@click.option("--workers", type=int, default=defaults.WORKERS, show_default=True)
@click.option("--epochs", type=int, default=defaults.EPOCHS, show_default=True)
@click.option(
    "--batch-size-per-worker", type=int, default=defaults.BATCH_SIZE_PER_WORKER, show_default=True
)
@click.option("--learning-rate", type=float, default=defaults.BASE_LEARNING_RATE, show_default=True)
@click.option("--threads-per-worker", type=int, default=0, help="0: cores / workers")
@lr_scaling_option
@min_workers_option
@model_options
@click.option("--data-source", default="bundled", show_default=True)
@click.option("--data-limit", type=int, default=0, help="keep only N samples per split (0: all)")
@click.option("--min-accuracy", type=float, default=defaults.MIN_ACCURACY, show_default=True)
@click.option("--model-name", default=defaults.MODEL_NAME, show_default=True)
@click.option("--root", default="runs", show_default=True, help="where runs and the registry go")
@click.option("--registry-root", default=None, help="default ROOT/registry")
@click.option(
    "--runner",
    type=click.Choice(["subprocess", "docker"]),
    default="subprocess",
    show_default=True,
    help="subprocess: every step in this environment; docker: every step in its image "
    "(build them with `make images-local`)",
)
@click.option(
    "--image-registry",
    default=defaults.LOCAL_IMAGE_REGISTRY,
    show_default=True,
    help="with --runner docker: where the step images come from",
)
@click.option("--image-tag", default=defaults.LOCAL_IMAGE_TAG, show_default=True)
def run_local_command(
    root: str,
    registry_root: str | None,
    runner: str,
    image_registry: str,
    image_tag: str,
    **params: object,
) -> None:
    """Run the whole pipeline on this machine (kfp.local, horovodrun, local disk)."""
    from pipeline.local_run import run_pipeline_locally

    if registry_root:
        params["registry_root"] = registry_root
    images = (image_registry, image_tag) if runner == "docker" else None
    try:
        run = run_pipeline_locally(root, docker_images=images, **params)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from exc
    click.echo("=" * 80)
    click.echo(f"kfp-horovod local run finished in {run.wall_seconds:.0f} s")
    for line in run.report_lines():
        click.echo(line)


COMMANDS = [compile_command, run_local_command]
