"""``python -m pipeline render-mpijob``: print the exact MPIJob manifest as YAML (a dry run).

Nothing touches a cluster. The manifest is validated against the CRD schema before printing.
The options are the declared fields of `TrainConfig` and `MPIJobParams`, under their own names.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click

from components.common import defaults, storage
from components.train.config import TRAIN_PARAMETERS
from components.train.mpijob.manifest import MPIJOB_PARAMETERS
from pipeline.cli_options import declared_options

if TYPE_CHECKING:
    from components.train.mpijob.manifest import MPIJobParams

EXAMPLE_BUCKET = "gs://YOUR_BUCKET/kfp-horovod"
# The trainer's fields, less its URIs (options of their own, defaulting to the example bucket).
TRAINER_OPTIONS = [p for p in TRAIN_PARAMETERS if p.name not in ("data", "output", "model_dir")]
# The pods' and run policy's fields, less the ones the command fills in.
POD_OPTIONS = [
    p for p in MPIJOB_PARAMETERS if p.name not in ("image", "owner_pod_name", "owner_pod_uid")
]


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
    data: str | None, output: str | None, model_dir: str | None, **options: Any
) -> MPIJobParams:
    """The MPIJobParams of the command's options; ValueError lists every bad one at once."""
    from components.train.config import TrainConfig
    from components.train.mpijob.manifest import MPIJobParams, uri_problems

    data = data or storage.join(EXAMPLE_BUCKET, "data")
    output = output or storage.join(EXAMPLE_BUCKET, "runs", options["run_name"])
    fields = {p.name: options.pop(p.name) for p in TRAINER_OPTIONS}
    try:
        train = TrainConfig(data=data, output=output, model_dir=model_dir, **fields)
    except ValueError as exc:
        problems = [str(exc), *uri_problems(data, output, model_dir)]
        raise ValueError("; ".join(problems)) from exc
    return MPIJobParams(train=train, **options)


@click.command("render-mpijob")
@click.option("--namespace", default=None, help="Set metadata.namespace.")
@click.option("--data", default=None, help="gs:// dataset [<bucket>/data].")
@click.option("--output", default=None, help="gs:// output [<bucket>/runs/<run>].")
@click.option("--model-dir", default=None, help="gs:// model dir [<output>/model].")
@click.option(
    "--image",
    default=None,
    help="Trainer image (overrides registry and tag) [the trainer image, or with "
    "--gpus-per-worker > 0 the GPU trainer image, of --image-registry and --image-tag].",
)
@click.option("--image-registry", default=defaults.DEFAULT_IMAGE_REGISTRY, show_default=True)
@click.option("--image-tag", default=defaults.PACKAGE_VERSION, show_default=True)
@click.option("--crd", "crd_path", default=None, help="CRD file [deploy/crd/...].")
@declared_options(TRAINER_OPTIONS)
@declared_options(POD_OPTIONS, {"run_name": "dry-run"})
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
