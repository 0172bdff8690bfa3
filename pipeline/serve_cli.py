"""``python -m pipeline render-inferenceservice`` / ``sync-serving``: serve the registry's
alias (`components.register.serving`) on a cluster with KServe, and repair its serving folder.

``render-inferenceservice`` prints the InferenceService as YAML (a dry run: it reads the
registry's alias, writes nothing, touches no cluster); it is validated against KServe's CRD
first. ``sync-serving`` makes the serving folder hold exactly the alias's version.
"""

from __future__ import annotations

from typing import Any

import click

from components.common.defaults import MODEL_NAME, PRODUCTION_ALIAS, TRAINER_SERVICE_ACCOUNT
from pipeline.cli_options import options

REGISTRY_HELP = "The pipeline's registry_root (gs://; local too for sync-serving)."
_registry_options = options(
    click.option("--registry-root", required=True, help=REGISTRY_HELP),
    click.option("--model-name", default=MODEL_NAME, show_default=True),
    click.option("--alias", default=PRODUCTION_ALIAS, show_default=True),
)


def _folder(registry_root: str, model_name: str, alias: str) -> Any:
    from components.register.registry import ModelStore
    from components.register.serving import ServingFolder

    return ServingFolder(ModelStore(registry_root, model_name), alias)


@click.command("render-inferenceservice")
@_registry_options
@click.option("--name", default=None, help="The InferenceService's name [the model name].")
@click.option("--namespace", default=None, help="Set metadata.namespace.")
@click.option("--service-account", default=TRAINER_SERVICE_ACCOUNT, show_default=True,
              help="The predictor's KSA (Workload Identity: reads the bucket).")  # fmt: skip
@click.option("--gpus", type=int, default=0, show_default=True, help="nvidia.com/gpu per pod.")
@click.option("--cpu", default="1", show_default=True, help="CPU per pod (requests = limits).")
@click.option("--memory", default="2Gi", show_default=True, help="Memory per pod.")
@click.option("--node-selector", default=None, help="JSON object of node label -> value.")
@click.option("--tolerations", default=None, help="JSON list of Kubernetes tolerations.")
@click.option("--poll-seconds", type=int, default=30, show_default=True,
              help="TF Serving re-reads the folder this often (0: at pod start only).")  # fmt: skip
@click.option("--runtime-version", default=None,
              help="TF Serving's image tag (a -gpu one with --gpus) [KServe's].")  # fmt: skip
@click.option("--crd", "crd_path", default=None, type=click.Path(exists=True, dir_okay=False),
              help="CRD file [deploy/crd/kserve/...].")  # fmt: skip
def render_inferenceservice(
    registry_root: str, model_name: str, alias: str, name: str | None, crd_path: str | None,
    node_selector: str | None, tolerations: str | None, **options: Any,
) -> None:  # fmt: skip
    """Print the KServe InferenceService that serves the alias's serving folder, as YAML."""
    import yaml

    from components.register.registry import RegistryError
    from components.serve import inferenceservice as isvc
    from components.train.cluster.crd import ManifestError

    try:
        folder = _folder(registry_root, model_name, alias)
        manifest = isvc.build_inferenceservice(
            name or model_name, folder.uri, **isvc.placement(node_selector, tolerations), **options
        )
        version = folder.alias_version()
        if version is None:
            raise ValueError(
                f"alias {alias!r} does not exist for model {model_name!r} in {registry_root}: "
                "no version to serve (a registration that beats the champion sets it)"
            )
        isvc.validate_inferenceservice(manifest, crd_path)
    except (ValueError, ManifestError, RegistryError, FileNotFoundError) as exc:
        raise click.UsageError(str(exc)) from exc
    if not folder.matches(version):
        click.echo(
            f"note: {folder.uri} does not hold version {version} alone yet: run "
            f"python -m pipeline sync-serving --registry-root {registry_root}",
            err=True,
        )
    click.echo(yaml.safe_dump(manifest, sort_keys=False, default_flow_style=False), nl=False)


@click.command("sync-serving")
@_registry_options
def sync_serving(registry_root: str, model_name: str, alias: str) -> None:
    """Make the alias's serving folder hold exactly the alias's version (repairs a registration
    that stopped between moving the alias and publishing it)."""
    from components.register.registry import RegistryError

    try:
        folder = _folder(registry_root, model_name, alias)
        version = folder.sync()
    except (ValueError, RegistryError) as exc:
        raise click.ClickException(str(exc)) from exc
    if version is None:
        raise click.ClickException(
            f"alias {alias!r} does not exist for model {model_name!r} in {registry_root}: "
            f"{folder.uri} left as it is"
        )
    click.echo(f"{folder.uri} holds version {version}, the one {alias!r} names")


COMMANDS = [render_inferenceservice, sync_serving]
