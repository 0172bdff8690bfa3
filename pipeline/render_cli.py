"""``python -m pipeline render-mpijob`` / ``render-trainjob``: print the exact manifests the
train step would submit, as YAML (a dry run).

Nothing touches a cluster. Every manifest is validated against its CRD's schema before it is
printed. The options are the declared fields of `TrainConfig`, `TrainStep` and the run's
(`ClusterJobParams`), under their own names; a TrainJob takes those that apply to it.
"""

from __future__ import annotations

from typing import Any

import click

from components.common import defaults, storage
from components.train.config import TRAIN_PARAMETERS
from components.train.step import TrainStep
from pipeline.cli_options import declared_options

EXAMPLE_BUCKET = "gs://YOUR_BUCKET/kfp-horovod"
# The trainer's fields, less its URIs (options of their own, defaulting to the example bucket).
TRAINER_OPTIONS = [p for p in TRAIN_PARAMETERS if p.name not in ("data", "output", "model_dir")]


def step_options(backend: str) -> list[Any]:
    """The train step's and the run's declared fields the render command of `backend` takes:
    all but the backend, the namespace (an option of its own) and what it refuses."""
    from components.common.declare import declared
    from components.train.cluster.job import CLUSTER_JOB_PARAMETERS
    from components.train.cluster.job import backend as backend_of

    skip = ("training_backend", "namespace", *backend_of(backend).refused)
    return [*CLUSTER_JOB_PARAMETERS, *(p for p in declared(TrainStep) if p.name not in skip)]


def render(
    backend: str,
    namespace: str | None,
    crd_dir: str | None,
    data: str | None,
    output: str | None,
    model_dir: str | None,
    image_registry: str,
    image_tag: str,
    **options: Any,
) -> str:
    """The validated manifests of `backend` for the command's options, as YAML documents;
    ValueError lists every bad option at once."""
    import yaml

    from components.train.cluster import job
    from components.train.config import TrainConfig

    data = data or storage.join(EXAMPLE_BUCKET, "data")
    output = output or storage.join(EXAMPLE_BUCKET, "runs", options["run_name"])
    trainer = {p.name: options.pop(p.name) for p in TRAINER_OPTIONS}
    run = {p.name: options.pop(p.name) for p in job.CLUSTER_JOB_PARAMETERS}
    images = defaults.image_refs(image_registry, image_tag)
    options["trainer_image"] = defaults.trainer_image(
        trainer["gpus_per_worker"], images, options["trainer_image"]
    )
    try:
        train = TrainConfig(data=data, output=output, model_dir=model_dir, **trainer)
    except ValueError as exc:
        raise ValueError("; ".join([str(exc), *job.uri_problems(data, output, model_dir)])) from exc
    params = job.ClusterJobParams(train=train, step=TrainStep(**options), **run)
    manifests = job.validated(job.backend(backend), params, namespace, crd_dir)
    return yaml.safe_dump_all(manifests, sort_keys=False, default_flow_style=False)


def render_command(backend: str, what: str) -> click.Command:
    """The click command ``render-<backend>``, which prints `what`."""

    @click.command(f"render-{backend}", help=f"Print {what} the train step would submit, as "
                   "YAML, without a cluster.")  # fmt: skip
    @click.option("--namespace", default=None, help="Set metadata.namespace.")
    @click.option("--data", default=None, help="gs:// dataset [<bucket>/data].")
    @click.option("--output", default=None, help="gs:// output [<bucket>/runs/<run>].")
    @click.option("--model-dir", default=None, help="gs:// model dir [<output>/model].")
    @click.option("--image-registry", default=defaults.DEFAULT_IMAGE_REGISTRY, show_default=True)
    @click.option("--image-tag", default=defaults.PACKAGE_VERSION, show_default=True)
    @click.option(
        "--crd-dir", default=None, type=click.Path(exists=True, file_okay=False),
        help="Folder of the CRD files [deploy/crd/...].",
    )  # fmt: skip
    @declared_options(TRAINER_OPTIONS)
    @declared_options(step_options(backend), {"run_name": "dry-run"})
    def command(**options: Any) -> None:
        try:
            click.echo(render(backend, **options), nl=False)
        except ValueError as exc:  # ManifestError too
            raise click.UsageError(str(exc)) from exc

    return command


render_mpijob = render_command("mpijob", "the MPIJob manifest")
render_trainjob = render_command(
    "trainjob", "the TrainingRuntime and the TrainJob (Kubeflow Trainer v2)"
)
