"""``python -m pipeline render-mpijob``: print the exact MPIJob manifest as YAML (a dry run).

Nothing touches a cluster. The manifest is validated against the CRD schema before printing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click

from components.common import defaults, storage
from pipeline.cli_options import min_workers_option, model_options, options

if TYPE_CHECKING:
    from components.train.mpijob.manifest import MPIJobParams

EXAMPLE_BUCKET = "gs://YOUR_BUCKET/kfp-horovod"
TRAIN_OPTIONS = (
    "workers", "slots_per_worker", "epochs", "batch_size_per_worker", "learning_rate",
    "warmup_epochs", "threads_per_worker", "seed", "model", "augment", "min_workers",
    "gpus_per_worker",
)  # fmt: skip


def render_yaml(
    params: MPIJobParams, namespace: str | None = None, crd_path: str | None = None
) -> str:
    """The validated manifest of `params` as a YAML document."""
    import yaml

    from components.train.mpijob.manifest import build_manifest
    from components.train.mpijob.validate import validate_manifest

    manifest = build_manifest(params, namespace)
    validate_manifest(manifest, crd_path)
    return yaml.safe_dump(manifest, sort_keys=False, default_flow_style=False)


def params_from_options(
    run_name: str, data: str | None, output: str | None, model_dir: str | None, **options: Any
) -> MPIJobParams:
    """The MPIJobParams of the command's options; ValueError lists every bad one at once."""
    from components.train.config import TrainConfig
    from components.train.mpijob.manifest import MPIJobParams, uri_problems

    data = data or storage.join(EXAMPLE_BUCKET, "data")
    output = output or storage.join(EXAMPLE_BUCKET, "runs", run_name)
    fields = {name: options.pop(name) for name in TRAIN_OPTIONS}
    try:
        train = TrainConfig(data=data, output=output, model_dir=model_dir, **fields)
    except ValueError as exc:
        problems = [str(exc), *uri_problems(data, output, model_dir)]
        raise ValueError("; ".join(problems)) from exc
    return MPIJobParams(run_name=run_name, train=train, **options)


# What the trainer is told (TrainConfig's fields, TRAIN_OPTIONS).
trainer_options = options(
    click.option("--workers", type=int, default=defaults.WORKERS, show_default=True),
    click.option(
        "--slots-per-worker", type=int, default=defaults.SLOTS_PER_WORKER, show_default=True
    ),
    click.option("--epochs", type=int, default=defaults.EPOCHS, show_default=True),
    click.option(
        "--batch-size",
        "batch_size_per_worker",
        type=int,
        default=defaults.BATCH_SIZE_PER_WORKER,
        show_default=True,
    ),
    click.option(
        "--learning-rate", type=float, default=defaults.BASE_LEARNING_RATE, show_default=True
    ),
    click.option("--warmup-epochs", type=int, default=defaults.WARMUP_EPOCHS, show_default=True),
    click.option("--threads-per-worker", type=int, default=0, help="0: cores / local workers"),
    click.option("--seed", type=int, default=defaults.SHUFFLE_SEED, show_default=True),
    model_options,
    min_workers_option,
    click.option(
        "--gpus",
        "gpus_per_worker",
        type=int,
        default=0,
        show_default=True,
        help="nvidia.com/gpu per worker; > 0 also picks the GPU trainer image",
    ),
)
# How the pods are sized, scheduled and cleaned up (MPIJobParams' own fields).
pod_options = options(
    click.option("--cpu", "cpu_per_worker", default=defaults.WORKER_CPU, show_default=True),
    click.option(
        "--memory", "memory_per_worker", default=defaults.WORKER_MEMORY, show_default=True
    ),
    click.option(
        "--ttl-seconds",
        "ttl_seconds_after_finished",
        type=int,
        default=defaults.MPIJOB_TTL_SECONDS_AFTER_FINISHED,
        show_default=True,
    ),
    click.option(
        "--backoff-limit", type=int, default=defaults.MPIJOB_BACKOFF_LIMIT, show_default=True
    ),
    click.option(
        "--deadline-seconds",
        "active_deadline_seconds",
        type=int,
        default=defaults.MPIJOB_ACTIVE_DEADLINE_SECONDS,
        show_default=True,
    ),
    click.option("--queue", default=None, help="Gang-scheduling queue (Volcano)."),
    click.option("--priority-class", default=None),
    click.option("--min-available", type=int, default=None, help="Gang size (default: all pods)."),
    click.option("--scheduler-name", default=None, help="e.g. volcano"),
    click.option("--service-account", default=None, help="KSA of the pods (Workload Identity)."),
)


@click.command("render-mpijob")
@click.option("--run-name", default="dry-run", show_default=True, help="Names the MPIJob.")
@click.option("--pipeline-run-id", default="", help="KFP run id (a label, and part of the name).")
@click.option("--namespace", default=None, help="Set metadata.namespace.")
@click.option("--data", default=None, help="gs:// dataset [<bucket>/data].")
@click.option("--output", default=None, help="gs:// output [<bucket>/runs/<run>].")
@click.option("--model-dir", default=None, help="gs:// model dir [<output>/model].")
@click.option(
    "--image",
    default=None,
    help="Trainer image (overrides registry and tag) [the trainer image, or with --gpus > 0 the "
    "GPU trainer image, of --image-registry and --image-tag].",
)
@click.option("--image-registry", default=defaults.DEFAULT_IMAGE_REGISTRY, show_default=True)
@click.option("--image-tag", default=defaults.PACKAGE_VERSION, show_default=True)
@click.option("--crd", "crd_path", default=None, help="CRD file [deploy/crd/...].")
@trainer_options
@pod_options
def render_mpijob(
    namespace: str | None,
    image: str | None,
    image_registry: str,
    image_tag: str,
    crd_path: str | None,
    **options: Any,
) -> None:
    """Print the MPIJob manifest the train step would submit, as YAML, without a cluster."""
    from components.train.mpijob.validate import ManifestError

    images = defaults.image_refs(image_registry, image_tag)
    image = defaults.trainer_image(options["gpus_per_worker"], images, image or "")
    try:
        params = params_from_options(image=image, **options)
        click.echo(render_yaml(params, namespace, crd_path), nl=False)
    except (ValueError, ManifestError) as exc:
        raise click.UsageError(str(exc)) from exc
