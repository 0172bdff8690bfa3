"""``python -m pipeline render-mpijob`` / ``render-trainjob``: print the exact manifests the
train step would submit, as YAML (a dry run).

Nothing touches a cluster. Every manifest is validated against its CRD's schema before it is
printed. The options are the declared fields of `TrainConfig` and `ClusterJobParams`, under
their own names (a TrainJob takes those that apply to it).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import click

from components.common import defaults, storage
from components.train.cluster.params import CLUSTER_JOB_PARAMETERS
from components.train.config import TRAIN_PARAMETERS
from pipeline.cli_options import declared_options

if TYPE_CHECKING:
    from components.train.cluster.params import ClusterJobParams

EXAMPLE_BUCKET = "gs://YOUR_BUCKET/kfp-horovod"
# The trainer's fields, less its URIs (options of their own, defaulting to the example bucket).
TRAINER_OPTIONS = [p for p in TRAIN_PARAMETERS if p.name not in ("data", "output", "model_dir")]
# The pods' and run policy's fields, less the ones the command fills in.
POD_OPTIONS = [
    p for p in CLUSTER_JOB_PARAMETERS if p.name not in ("image", "owner_pod_name", "owner_pod_uid")
]
# A TrainJob's launcher is node 0 (sized as a worker), and its gang scheduling is the runtime's.
TRAINJOB_POD_OPTIONS = [
    p
    for p in POD_OPTIONS
    if p.name not in ("launcher_cpu", "launcher_memory", "queue", "min_available")
]


def _yaml(*manifests: dict[str, Any]) -> str:
    import yaml

    return yaml.safe_dump_all(manifests, sort_keys=False, default_flow_style=False)


def render_yaml(
    params: ClusterJobParams, namespace: str | None = None, crd_path: str | None = None
) -> str:
    """The validated MPIJob of `params` as a YAML document."""
    from components.train.mpijob.manifest import build_manifest
    from components.train.mpijob.validate import validate_manifest

    manifest = build_manifest(params, namespace)
    validate_manifest(manifest, crd_path)
    return _yaml(manifest)


def render_trainjob_yaml(
    params: ClusterJobParams, namespace: str | None = None, crd_dir: str | None = None
) -> str:
    """The validated TrainingRuntime and TrainJob of `params`, as two YAML documents."""
    from components.train.trainjob.manifest import build_manifests, validate_manifests

    runtime, trainjob = build_manifests(params, namespace)
    validate_manifests(runtime, trainjob, crd_dir)
    return _yaml(runtime, trainjob)


def params_from_options(
    data: str | None, output: str | None, model_dir: str | None, **options: Any
) -> ClusterJobParams:
    """The ClusterJobParams of the command's options; ValueError lists every bad one at once."""
    from components.train.cluster.params import ClusterJobParams, uri_problems
    from components.train.config import TrainConfig

    data = data or storage.join(EXAMPLE_BUCKET, "data")
    output = output or storage.join(EXAMPLE_BUCKET, "runs", options["run_name"])
    fields = {p.name: options.pop(p.name) for p in TRAINER_OPTIONS}
    try:
        train = TrainConfig(data=data, output=output, model_dir=model_dir, **fields)
    except ValueError as exc:
        problems = [str(exc), *uri_problems(data, output, model_dir)]
        raise ValueError("; ".join(problems)) from exc
    return ClusterJobParams(train=train, **options)


def _common_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """The options both render commands share: namespace, URIs and the image."""
    for option in reversed([
        click.option("--namespace", default=None, help="Set metadata.namespace."),
        click.option("--data", default=None, help="gs:// dataset [<bucket>/data]."),
        click.option("--output", default=None, help="gs:// output [<bucket>/runs/<run>]."),
        click.option("--model-dir", default=None, help="gs:// model dir [<output>/model]."),
        click.option(
            "--image", default=None,
            help="Trainer image (overrides registry and tag) [the trainer image, or with "
            "--gpus-per-worker > 0 the GPU trainer image, of --image-registry and --image-tag].",
        ),  # fmt: skip
        click.option(
            "--image-registry", default=defaults.DEFAULT_IMAGE_REGISTRY, show_default=True
        ),
        click.option("--image-tag", default=defaults.PACKAGE_VERSION, show_default=True),
        declared_options(TRAINER_OPTIONS),
    ]):  # fmt: skip
        func = option(func)
    return func


def _params(image: str | None, image_registry: str, image_tag: str, **options: Any) -> Any:
    images = defaults.image_refs(image_registry, image_tag)
    image = defaults.trainer_image(options["gpus_per_worker"], images, image or "")
    return params_from_options(image=image, **options)


@click.command("render-mpijob")
@_common_options
@click.option(
    "--crd", "crd_path", default=None, type=click.Path(exists=True, dir_okay=False),
    help="CRD file [deploy/crd/...].",
)  # fmt: skip
@declared_options(POD_OPTIONS, {"run_name": "dry-run"})
def render_mpijob(namespace: str | None, crd_path: str | None, **options: Any) -> None:
    """Print the MPIJob manifest the train step would submit, as YAML, without a cluster."""
    from components.train.cluster.crd import ManifestError

    try:
        click.echo(render_yaml(_params(**options), namespace, crd_path), nl=False)
    except (ValueError, ManifestError) as exc:
        raise click.UsageError(str(exc)) from exc


@click.command("render-trainjob")
@_common_options
@click.option(
    "--crd-dir", default=None, type=click.Path(exists=True, file_okay=False),
    help="Folder of the Trainer CRD files [deploy/crd/trainer].",
)  # fmt: skip
@declared_options(TRAINJOB_POD_OPTIONS, {"run_name": "dry-run"})
def render_trainjob(namespace: str | None, crd_dir: str | None, **options: Any) -> None:
    """Print the TrainingRuntime and the TrainJob the train step would submit (Kubeflow
    Trainer v2), as YAML, without a cluster."""
    from components.train.cluster.crd import ManifestError

    try:
        click.echo(render_trainjob_yaml(_params(**options), namespace, crd_dir), nl=False)
    except (ValueError, ManifestError) as exc:
        raise click.UsageError(str(exc)) from exc
