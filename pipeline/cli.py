"""The ``python -m pipeline`` command line: one click group (operating on KFP: `pipeline.ops`).
The render commands print validated manifests (the train step's jobs, the InferenceService of a
registry's alias) without touching a cluster."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from components.common import defaults, storage, storage_access
from components.common.declare import Declared, JsonText, declared, declared_options
from components.common.failure import InputError, Stopped, one_line_failures, stops_on_signals
from components.common.placement import Placement
from components.data_prep.step_parameters import PrepStep
from components.register.step_parameters import RegisterStep
from components.train.config import TrainConfig
from components.train.launcher.parameters import TrainStep
from pipeline.ops import COMMANDS as OPS_COMMANDS


@click.command("compile")
@click.option("--output", default="build/pipeline.yaml", show_default=True, help="YAML to write")
@click.option("--image-registry", help=f"[default: {defaults.DEFAULT_IMAGE_REGISTRY}]")
@click.option("--image-tag", help=f"[default: the package version, {defaults.PACKAGE_VERSION}]")
def compile_command(output: str, image_registry: str | None, image_tag: str | None) -> None:
    """Compile the pipeline into one YAML file (upload it in the KFP UI as it is)."""
    from pipeline.build import compile_pipeline

    click.echo(f"pipeline: {compile_pipeline(output, image_registry, image_tag)}")


@click.command("run-local")
# --registry-root: required by the pipeline, optional here (under --root when not given).
@declared_options(
    [
        *TrainConfig.parameters(pipeline_only=True),
        *PrepStep.parameters(),
        *RegisterStep.parameters(),
    ],
    {"registry_root": ""},
)
@click.option(
    "--root",
    default="runs",
    show_default=True,
    help="the local folder where runs (and the registry, unless --registry-root) go; not a URI",
)
@click.option(
    "--runner",
    type=click.Choice(["subprocess", "docker"]),
    default="subprocess",
    show_default=True,
    help="subprocess: every step in this environment; docker: every "
    "step in its image (build them with `make images-local`)",
)
@click.option(
    "--image-registry",
    default=defaults.LOCAL_IMAGE_REGISTRY,
    show_default=True,
    help="with --runner docker: where the step images come from",
)
@click.option("--image-tag", default=defaults.LOCAL_IMAGE_TAG, show_default=True)
def run_local_command(
    root: str, runner: str, image_registry: str, image_tag: str, **params: object
) -> None:
    """Run the whole pipeline on this machine (kfp.local, mpirun, local disk). SIGTERM or
    Ctrl-C ends every process the run started, within 10 s, in one STOPPED line (exit 128 + N)."""
    from pipeline.local_run import RunFailed, RunStop, run_pipeline_locally

    if not params["registry_root"]:  # run_pipeline_locally's default: under ROOT
        del params["registry_root"]
    images = (image_registry, image_tag) if runner == "docker" else None
    stop = RunStop()
    try:
        with stops_on_signals(stop):
            run = run_pipeline_locally(root, docker_images=images, stop=stop, **params)
    except RunFailed as exc:  # the console ends with its FAILED line and the log's path
        raise SystemExit(exc.exit_code) from exc
    except Stopped as stopped:  # before the steps' console: the group's handler prints it
        stopped.ended.append(stop.finish())
        raise
    click.echo("=" * 80)
    click.echo(f"kfp-horovod local run finished in {run.wall_seconds:.0f} s")
    click.echo("\n".join(run.report_lines()))


@click.command("parameters")
def parameters_command() -> None:
    """Print docs/parameters.md: every pipeline parameter, from its declaration."""
    from pipeline.checks import parameters_markdown

    click.echo(parameters_markdown(), nl=False)


EXAMPLE_BUCKET = "gs://YOUR_BUCKET/kfp-horovod"
# The trainer's fields, less its URIs (options of their own, defaulting to the example bucket).
TRAINER_OPTIONS = [
    p for p in TrainConfig.parameters() if p.name not in ("data", "output", "model_dir")
]


def step_options(backend: str) -> list[Declared]:
    """The train step's and the run's declared fields the render command of `backend` takes:
    all but the backend, the namespace (an option of its own) and what it refuses."""
    from components.train.launcher.cluster.job import CLUSTER_JOB_PARAMETERS, job_kind

    skip = ("training_backend", "namespace", *job_kind(backend).refused)
    steps = [p for p in declared(TrainStep) if p.name not in skip]
    return [*CLUSTER_JOB_PARAMETERS, *steps, *Placement.parameters()]


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
    """The validated manifests of `backend` for the command's options, as YAML documents,
    written for the job's CRD in `crd_dir` (a release's: deploy/crd/trainer/<version>) as the
    train step writes them for the cluster's; InputError lists every bad option at once."""
    import yaml

    from components.train.config import TrainConfig
    from components.train.launcher.cluster import job

    data = data or storage.join(EXAMPLE_BUCKET, "data")
    output = output or storage.join(EXAMPLE_BUCKET, "runs", options["run_name"])
    trainer = {p.name: options.pop(p.name) for p in TRAINER_OPTIONS}
    run = {p.name: options.pop(p.name) for p in job.CLUSTER_JOB_PARAMETERS}
    placement = {p.name: options.pop(p.name) for p in Placement.parameters()}
    images = defaults.image_refs(image_registry, image_tag)
    options["trainer_image"] = defaults.trainer_image(
        trainer["gpus_per_worker"], images, options["trainer_image"]
    )
    try:
        train = TrainConfig(data=data, output=output, model_dir=model_dir, **trainer)
    except ValueError as exc:
        raise InputError("; ".join([str(exc), *job.uri_problems(data, output, model_dir)])) from exc
    params = job.ClusterJobParams(
        train=train, step=TrainStep(**options), task_config=job.PodConfig(**placement), **run
    )  # the placement takes the train task config's path
    manifests, deadline = job.validated(job.job_kind(backend), params, namespace, crd_dir)
    if deadline.by == job.BY_STEP:
        click.echo(f"note: {deadline.said(0)}", err=True)
    return yaml.safe_dump_all(manifests, sort_keys=False, default_flow_style=False)


def render_command(backend: str, what: str) -> click.Command:
    """The click command ``render-<backend>``, which prints `what`."""

    @click.command(
        f"render-{backend}",
        help=f"Print {what} the train step would submit, as YAML, without a cluster.",
    )
    @click.option("--namespace", default=None, help="Set metadata.namespace.")
    @click.option("--data", default=None, help="gs:// dataset [<bucket>/data].")
    @click.option("--output", default=None, help="gs:// output [<bucket>/runs/<run>].")
    @click.option("--model-dir", default=None, help="gs:// model dir [<output>/model].")
    @click.option("--image-registry", default=defaults.DEFAULT_IMAGE_REGISTRY, show_default=True)
    @click.option("--image-tag", default=defaults.PACKAGE_VERSION, show_default=True)
    @click.option(
        "--crd-dir",
        default=None,
        type=click.Path(exists=True, file_okay=False),
        help="Folder of the CRD files, e.g. deploy/crd/trainer/v2.1.0 [the packaged ones].",
    )
    @declared_options(TRAINER_OPTIONS)
    @declared_options(step_options(backend), {"run_name": "dry-run"})
    def command(**options: Any) -> None:
        click.echo(render(backend, **options), nl=False)

    return command


def registry_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """The serving folder's options: the registry, the model and its alias."""
    func = click.option("--alias", default=defaults.PRODUCTION_ALIAS, show_default=True)(func)
    func = click.option("--model-name", default=defaults.MODEL_NAME, show_default=True)(func)
    help_text = "The pipeline's registry_root (gs://; local too for sync-serving)."
    return click.option("--registry-root", required=True, help=help_text)(func)


def check_registry_access(registry_root: str, writes: bool) -> None:
    """A ``gs://`` registry this identity cannot read (or, `writes`, write) ends the command
    in one ``FAILED:`` line naming what is missing, before anything is read or written."""
    storage_access.check([storage_access.Location("--registry-root", registry_root, writes)])


def _serving_folder(registry_root: str, model_name: str, alias: str) -> Any:
    from components.register.registry import ModelStore
    from components.register.serving import ServingFolder

    return ServingFolder(ModelStore(registry_root, model_name), alias)


@click.command("render-inferenceservice")
@registry_options
@click.option("--name", default=None, help="The InferenceService's name [the model name].")
@click.option("--namespace", default=None, help="Set metadata.namespace.")
@click.option(
    "--service-account",
    default=defaults.TRAINER_SERVICE_ACCOUNT,
    show_default=True,
    help="The predictor's KSA (Workload Identity: reads the bucket).",
)
@click.option("--gpus", type=int, default=0, show_default=True, help="nvidia.com/gpu per pod.")
@click.option("--cpu", default="1", show_default=True, help="CPU per pod (requests = limits).")
@click.option("--memory", default="2Gi", show_default=True, help="Memory per pod.")
@click.option("--node-selector", type=JsonText(), help="JSON object of node label -> value.")
@click.option("--tolerations", type=JsonText(), help="JSON list of Kubernetes tolerations.")
@click.option(
    "--poll-seconds",
    type=int,
    default=30,
    show_default=True,
    help="TF Serving re-reads the folder this often (0: at pod start only).",
)
@click.option(
    "--runtime-version",
    default=None,
    help="TF Serving's image tag (a -gpu one with --gpus) [KServe's].",
)
@click.option(
    "--crd",
    "crd_path",
    default=None,
    type=click.Path(exists=True, dir_okay=False),
    help="CRD file [deploy/crd/kserve/...].",
)
def render_inferenceservice(
    registry_root: str,
    model_name: str,
    alias: str,
    name: str | None,
    crd_path: str | None,
    **options: Any,
) -> None:
    """Print the KServe InferenceService that serves the alias's serving folder, as YAML (a dry
    run: it reads the alias, writes nothing)."""
    import yaml

    from components.serve import inferenceservice as isvc

    check_registry_access(registry_root, writes=False)
    folder = _serving_folder(registry_root, model_name, alias)
    manifest = isvc.build_inferenceservice(name or model_name, folder.uri, **options)
    version = folder.alias_version()
    if version is None:
        raise InputError(
            f"alias {alias!r} does not exist for model {model_name!r} in {registry_root}: "
            "no version to serve (a registration that beats the champion sets it)"
        )
    isvc.validate_inferenceservice(manifest, crd_path)
    if not folder.matches(version):
        sync = f"python -m pipeline sync-serving --registry-root {registry_root}"
        click.echo(
            f"note: {folder.uri} does not hold version {version} alone yet: run {sync}", err=True
        )
    click.echo(yaml.safe_dump(manifest, sort_keys=False, default_flow_style=False), nl=False)


@click.command("sync-serving")
@registry_options
def sync_serving(registry_root: str, model_name: str, alias: str) -> None:
    """Make the alias's serving folder hold exactly the alias's version (repairs a registration
    that stopped between moving the alias and publishing it)."""
    check_registry_access(registry_root, writes=True)
    folder = _serving_folder(registry_root, model_name, alias)
    version = folder.sync()
    if version is None:
        raise InputError(
            f"alias {alias!r} does not exist for model {model_name!r} in {registry_root}: "
            f"{folder.uri} left as it is"
        )
    click.echo(f"{folder.uri} holds version {version}, the one {alias!r} names")


class OneLineGroup(click.Group):
    """Every command's expected failure (`ExpectedError`) ends in one line and its exit code."""

    def invoke(self, ctx: click.Context) -> Any:
        with one_line_failures():
            return super().invoke(ctx)


@click.group(
    cls=OneLineGroup,
    context_settings={"help_option_names": ["-h", "--help"]},
    commands=[
        compile_command,
        run_local_command,
        parameters_command,
        render_command("mpijob", "the MPIJob manifest"),
        render_command("trainjob", "the TrainingRuntime and the TrainJob (Kubeflow Trainer v2)"),
        render_inferenceservice,
        sync_serving,
        *OPS_COMMANDS,
    ],
)
def cli() -> None:
    """Compile, run locally, render the cluster job, and operate the pipeline on a KFP cluster."""
