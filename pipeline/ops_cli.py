"""``python -m pipeline upload | submit | schedule | version-name``: operate the pipeline on KFP.

A thin click layer over :mod:`pipeline.ops`. Connection flags fall back to environment
variables, read when a command runs: ``KF_PIPELINES_ENDPOINT`` (kfp's own),
``KF_PIPELINES_NAMESPACE``, ``KF_PIPELINES_TOKEN`` and ``KF_PIPELINES_SA_TOKEN_PATH`` (kfp's
own).

Exit codes: 0 ok; 1 bad input or a KFP/API error (the message says which); 2 usage error;
3 the run ended FAILED, CANCELED or SKIPPED (the message names the failed tasks); 4 ``--wait``
timed out.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from pipeline import ops
from pipeline.cli_options import options

EXIT_RUN_FAILED = 3
EXIT_RUN_TIMEOUT = 4

F = TypeVar("F", bound=Callable[..., Any])


class OpsClickError(click.ClickException):
    """A :class:`pipeline.ops.OpsError` shown as ``Error: <message>``; exits 1."""


class RunFailedExit(OpsClickError):
    """The run ended FAILED, CANCELED or SKIPPED; exits 3."""

    exit_code = EXIT_RUN_FAILED


class RunTimeoutExit(OpsClickError):
    """``--wait`` timed out; exits 4."""

    exit_code = EXIT_RUN_TIMEOUT


def handle_ops_errors(func: F) -> F:
    """Turn :class:`pipeline.ops.OpsError` raised by a command into a clean exit."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except ops.RunFailedError as exc:
            raise RunFailedExit(str(exc)) from exc
        except ops.RunTimeoutError as exc:
            raise RunTimeoutExit(str(exc)) from exc
        except ops.OpsError as exc:
            raise OpsClickError(str(exc)) from exc

    return wrapper  # type: ignore[return-value]


def connection_options(func: F) -> F:
    """Add the KFP connection flags; the command receives them as one ``settings`` argument."""

    @click.option(
        "--host",
        envvar="KF_PIPELINES_ENDPOINT",
        show_envvar=True,
        help="KFP API endpoint, e.g. http://localhost:8888. Unset: in-cluster or kubeconfig.",
    )
    @click.option(
        "--namespace",
        envvar="KF_PIPELINES_NAMESPACE",
        show_envvar=True,
        help="Profile namespace on a multi-user KFP; leave unset on a standalone KFP.",
    )
    @click.option(
        "--token",
        envvar="KF_PIPELINES_TOKEN",
        show_envvar=True,
        help="Bearer token made outside the SDK (prefer the env var: flags show in `ps`).",
    )
    @click.option(
        "--sa-token-path",
        envvar="KF_PIPELINES_SA_TOKEN_PATH",
        show_envvar=True,
        type=click.Path(dir_okay=False),
        help="Projected service-account token file (pods talking to a multi-user KFP).",
    )
    @click.option(
        "--request-timeout",
        type=click.FloatRange(min=0.1),
        default=ops.DEFAULT_REQUEST_TIMEOUT_S,
        show_default=True,
        help="Seconds to wait for each API request.",
    )
    @functools.wraps(func)
    def wrapper(
        *args: Any,
        host: str | None,
        namespace: str | None,
        token: str | None,
        sa_token_path: str | None,
        request_timeout: float,
        **kwargs: Any,
    ) -> Any:
        settings = ops.KfpSettings(
            host=host or None,
            namespace=namespace or None,
            token=token or None,
            sa_token_path=sa_token_path or None,
            request_timeout=request_timeout,
        )
        return func(*args, settings=settings, **kwargs)

    return wrapper  # type: ignore[return-value]


package_option = click.option(
    "--package",
    type=click.Path(dir_okay=False, path_type=Path),
    default=ops.DEFAULT_PACKAGE,
    show_default=True,
    help="Compiled pipeline YAML (python -m pipeline compile --output ...).",
)
param_option = click.option(
    "--param",
    "params",
    multiple=True,
    metavar="NAME=VALUE",
    help="Pipeline parameter; repeat. Typed by the pipeline's declared inputs.",
)
experiment_option = click.option(
    "--experiment",
    default=ops.DEFAULT_EXPERIMENT,
    show_default=True,
    help="Experiment to file the runs under (created if missing).",
)


def _echo_state(state: str) -> None:
    """Print a run's new state to stderr while waiting."""
    click.echo(f"run state: {state}", err=True)


@click.command("version-name")
def version_name_command() -> None:
    """Print the pipeline version name of this checkout: <package version>-g<commit>[-dirty]."""
    try:
        click.echo(ops.git_version_name())
    except ops.OpsError as exc:
        raise OpsClickError(str(exc)) from exc


@click.command("upload")
@package_option
@click.option("--pipeline-name", help="Pipeline name [default: the package's pipeline name].")
@click.option(
    "--version-name",
    help="Version name [default: <package version>-g<commit>[-dirty], see `version-name`].",
)
@click.option("--description", help="Description shown in the KFP UI.")
@click.option(
    "--reuse-existing",
    is_flag=True,
    help="If the version exists already, keep it and succeed (re-run CI jobs).",
)
@connection_options
@handle_ops_errors
def upload_command(
    settings: ops.KfpSettings,
    package: Path,
    pipeline_name: str | None,
    version_name: str | None,
    description: str | None,
    reuse_existing: bool,
) -> None:
    """Create the pipeline, or add a new version to it, from the compiled package."""
    ops.read_pipeline_spec(package)  # fail on a bad package before touching the network
    name = version_name or ops.git_version_name()
    client = ops.connect(settings)
    result = ops.upload(
        client,
        package,
        name,
        pipeline_name=pipeline_name,
        description=description,
        namespace=settings.namespace,
        reuse_existing=reuse_existing,
    )
    if result.created_pipeline:
        click.echo(f"created pipeline {result.pipeline_name} ({result.pipeline_id})")
    what = "uploaded" if result.created_version else "kept existing"
    click.echo(
        f"{what} version {result.version_name} ({result.version_id}) "
        f"of pipeline {result.pipeline_name} ({result.pipeline_id})"
    )


run_options = options(
    click.option("--run-name", help="Run name [default: <pipeline> <version> <UTC time>]."),
    click.option("--pipeline-root", help="Override the pipeline root (e.g. gs://bucket/root)."),
    click.option("--service-account", help="Kubernetes service account the run's pods use."),
    click.option(
        "--caching/--no-caching",
        default=None,
        help="Override every task's caching [default: as compiled].",
    ),
)
wait_options = options(
    click.option("--wait", is_flag=True, help="Follow the run; exit 3 if it fails, 4 on timeout."),
    click.option(
        "--timeout",
        type=click.FloatRange(min=1),
        default=3600.0,
        show_default=True,
        help="Seconds --wait waits for the run to finish.",
    ),
    click.option(
        "--poll-interval",
        type=click.FloatRange(min=0.01),
        default=10.0,
        show_default=True,
        help="Seconds between status checks with --wait.",
    ),
)


def _run_source(
    settings: ops.KfpSettings,
    package: Path,
    version_name: str | None,
    pipeline_name: str | None,
    params: tuple[str, ...],
) -> tuple[Any, dict[str, Any], str, dict[str, Any]]:
    """Return ``(client, arguments, pipeline name, source)`` for a submit.

    From the package, the parameters are checked before connecting; from an uploaded
    version, against that version's declared inputs.
    """
    if version_name is None:
        spec = ops.read_pipeline_spec(package)
        arguments = ops.parse_parameters(params, ops.declared_parameters(spec))
        client = ops.connect(settings)
        return client, arguments, ops.pipeline_name_of(spec), {"package_path": package}
    name = pipeline_name
    if name is None:
        name = ops.DEFAULT_PIPELINE_NAME
        if package.is_file():
            name = ops.pipeline_name_of(ops.read_pipeline_spec(package))
    client = ops.connect(settings)
    pipeline, version = ops.resolve_version(client, name, version_name, settings.namespace)
    arguments = ops.parse_parameters(params, ops.declared_parameters(version.pipeline_spec or {}))
    source = {"pipeline_id": pipeline.pipeline_id, "version_id": version.pipeline_version_id}
    return client, arguments, name, source


@click.command("submit")
@package_option
@click.option(
    "--version-name",
    help="Run this uploaded version of --pipeline-name instead of the package.",
)
@click.option(
    "--pipeline-name",
    help="Pipeline of --version-name [default: the package's pipeline name, "
    f"else {ops.DEFAULT_PIPELINE_NAME}].",
)
@param_option
@experiment_option
@run_options
@wait_options
@connection_options
@handle_ops_errors
def submit_command(
    settings: ops.KfpSettings,
    package: Path,
    version_name: str | None,
    pipeline_name: str | None,
    params: tuple[str, ...],
    experiment: str,
    run_name: str | None,
    pipeline_root: str | None,
    service_account: str | None,
    caching: bool | None,
    wait: bool,
    timeout: float,
    poll_interval: float,
) -> None:
    """Create a run from the compiled package (or an uploaded version); --wait follows it."""
    client, arguments, pipeline_display, source = _run_source(
        settings, package, version_name, pipeline_name, params
    )
    experiment_id = ops.get_or_create_experiment(client, experiment, settings.namespace)
    run = ops.submit_run(
        client,
        run_name=run_name or ops.default_run_name(pipeline_display, version_name),
        experiment_id=experiment_id,
        params=arguments,
        pipeline_root=pipeline_root,
        service_account=service_account,
        enable_caching=caching,
        **source,
    )
    click.echo(f"created run {run.run_id}: {run.display_name}")
    if not wait:
        return
    ops.wait_for_run(client, run.run_id, timeout, poll_interval=poll_interval, on_state=_echo_state)
    click.echo(f"run {run.run_id} SUCCEEDED")


@click.group("schedule")
def schedule_group() -> None:
    """Create, list, pause, resume and delete recurring runs of an uploaded pipeline version."""


schedule_policy_options = options(
    click.option(
        "--max-concurrency",
        type=int,
        default=1,
        show_default=True,
        help=f"Runs of this schedule allowed at once (1-{ops.MAX_CONCURRENCY_LIMIT}).",
    ),
    click.option(
        "--catchup/--no-catchup",
        default=False,
        show_default=True,
        help="Backfill the intervals missed while paused or behind.",
    ),
    click.option("--paused", is_flag=True, help="Create it disabled."),
)


@schedule_group.command("create")
@click.option("--name", required=True, help="Schedule (recurring run) name; must be unused.")
@click.option(
    "--cron",
    required=True,
    help="6-field cron, seconds first: SEC MIN HOUR DOM MON DOW, e.g. '0 0 2 * * *'.",
)
@click.option("--version-name", required=True, help="Uploaded pipeline version to run.")
@click.option(
    "--pipeline-name",
    default=ops.DEFAULT_PIPELINE_NAME,
    show_default=True,
    help="Pipeline of --version-name.",
)
@param_option
@experiment_option
@schedule_policy_options
@click.option("--service-account", help="Kubernetes service account the run's pods use.")
@connection_options
@handle_ops_errors
def schedule_create_command(
    settings: ops.KfpSettings,
    name: str,
    cron: str,
    version_name: str,
    pipeline_name: str,
    params: tuple[str, ...],
    experiment: str,
    max_concurrency: int,
    catchup: bool,
    paused: bool,
    service_account: str | None,
) -> None:
    """Create a recurring run of a named pipeline version."""
    ops.validate_cron(cron)  # before connecting: a typo should not need a cluster
    client = ops.connect(settings)
    pipeline, version = ops.resolve_version(client, pipeline_name, version_name, settings.namespace)
    arguments = ops.parse_parameters(params, ops.declared_parameters(version.pipeline_spec or {}))
    experiment_id = ops.get_or_create_experiment(client, experiment, settings.namespace)
    created = ops.create_schedule(
        client,
        name=name,
        cron=cron,
        pipeline_id=pipeline.pipeline_id,
        version_id=version.pipeline_version_id,
        experiment_id=experiment_id,
        params=arguments,
        max_concurrency=max_concurrency,
        no_catchup=not catchup,
        enabled=not paused,
        namespace=settings.namespace,
        service_account=service_account,
    )
    click.echo(f"created schedule {created.recurring_run_id}: {name} ({cron})")


@schedule_group.command("list")
@click.option("--pipeline-name", help="Only schedules of this pipeline.")
@connection_options
@handle_ops_errors
def schedule_list_command(settings: ops.KfpSettings, pipeline_name: str | None) -> None:
    """List recurring runs: id, name, mode, cron, max concurrency, catchup, version id."""
    client = ops.connect(settings)
    schedules = ops.find_schedules(client, namespace=settings.namespace)
    if pipeline_name is not None:
        pipeline = ops.find_pipeline(client, pipeline_name, settings.namespace)
        if pipeline is None:
            raise ops.NotFoundError(f"no pipeline named {pipeline_name!r} on the server")
        schedules = [
            s
            for s in schedules
            if s.pipeline_version_reference
            and s.pipeline_version_reference.pipeline_id == pipeline.pipeline_id
        ]
    click.echo("ID\tNAME\tMODE\tCRON\tMAX_CONCURRENCY\tCATCHUP\tVERSION_ID")
    for s in schedules:
        cron = s.trigger.cron_schedule.cron if s.trigger and s.trigger.cron_schedule else "-"
        ref = s.pipeline_version_reference
        version_id = (ref.pipeline_version_id if ref else None) or "-"
        catchup = "no" if s.no_catchup else "yes"
        click.echo(
            f"{s.recurring_run_id}\t{s.display_name}\t{s.mode}\t{cron}\t"
            f"{s.max_concurrency}\t{catchup}\t{version_id}"
        )


def _schedule_action(verb: str) -> click.Command:
    """Build ``schedule <verb> NAME_OR_ID`` applying ``ops.<verb>_schedule`` to the schedule
    found (looked up when it runs: importing ``ops`` at start-up would import ``kfp``)."""

    @click.argument("ref", metavar="NAME_OR_ID")
    @connection_options
    @handle_ops_errors
    def command(settings: ops.KfpSettings, ref: str) -> None:
        client = ops.connect(settings)
        schedule = ops.resolve_schedule(client, ref, settings.namespace)
        getattr(ops, f"{verb}_schedule")(client, schedule.recurring_run_id)
        click.echo(f"{verb}d schedule {schedule.recurring_run_id}: {schedule.display_name}")

    command.__doc__ = f"{verb.capitalize()} the schedule with this name (or id)."
    return click.command(verb)(command)


for _verb in ("pause", "resume", "delete"):
    schedule_group.add_command(_schedule_action(_verb))

COMMANDS: tuple[click.Command, ...] = (
    upload_command,
    submit_command,
    schedule_group,
    version_name_command,
)
