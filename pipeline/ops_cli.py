"""``python -m pipeline upload | submit | schedule | version-name``: the click layer over
:mod:`pipeline.ops`, which is imported when a command runs (it imports ``kfp``).

Connection flags fall back to ``KF_PIPELINES_ENDPOINT``, ``KF_PIPELINES_NAMESPACE``,
``KF_PIPELINES_TOKEN`` and ``KF_PIPELINES_SA_TOKEN_PATH``, read when a command runs. Exit
codes: 0 ok; 1 bad input or a KFP error; 2 usage; 3 the run failed (naming the failed tasks);
4 ``--wait`` timed out.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from components.common import defaults
from pipeline.cli_options import options

connection = options(
    click.option("--host", envvar="KF_PIPELINES_ENDPOINT", show_envvar=True, help="KFP API."),
    click.option("--namespace", envvar="KF_PIPELINES_NAMESPACE", show_envvar=True),
    click.option("--token", envvar="KF_PIPELINES_TOKEN", show_envvar=True, help="Bearer token."),
    click.option("--sa-token-path", envvar="KF_PIPELINES_SA_TOKEN_PATH", show_envvar=True),
)
package_option = click.option(
    "--package", type=click.Path(dir_okay=False, path_type=Path), default="build/pipeline.yaml"
)
param_option = click.option("--param", "params", multiple=True, metavar="NAME=VALUE")
experiment_option = click.option("--experiment", default="Default", show_default=True)


def _client(kw: dict[str, Any]) -> Any:
    """Connect with the connection flags in `kw` (removed from it)."""
    from pipeline import ops

    names = ("host", "namespace", "token", "sa_token_path")
    return ops.connect(*(kw.pop(n) or None for n in names))


@click.command("version-name")
def version_name_command() -> None:
    """Print the pipeline version name of this checkout: <package version>-g<commit>[-dirty]."""
    from pipeline import ops

    click.echo(ops.git_version_name())


@click.command("upload")
@package_option
@click.option("--pipeline-name", help="[default: the package's pipeline name]")
@click.option("--version-name", help="[default: <package version>-g<commit>[-dirty]]")
@click.option("--reuse-existing", is_flag=True, help="Keep an existing version and succeed.")
@connection
def upload_command(package: Path, pipeline_name: str | None, version_name: str | None,
                   reuse_existing: bool, **kw: Any) -> None:  # fmt: skip
    """Create the pipeline, or add a new version to it, from the compiled package."""
    from pipeline import ops

    spec = ops.read_pipeline_spec(package)  # a bad package fails before connecting
    pipeline_name = pipeline_name or ops.pipeline_name_of(spec)
    name = version_name or ops.git_version_name()
    pid, vid, uploaded = ops.upload(_client(kw), package, name, pipeline_name, reuse_existing)
    what = "uploaded" if uploaded else "kept existing"
    click.echo(f"{what} version {name} ({vid}) of pipeline {pipeline_name} ({pid})")


@click.command("submit")
@package_option
@click.option("--version-name", help="Run this uploaded version instead of the package.")
@click.option("--pipeline-name", default=defaults.PIPELINE_NAME, show_default=True)
@param_option
@experiment_option
@click.option("--run-name", help="[default: <pipeline> <version> <UTC time>]")
@click.option("--pipeline-root")
@click.option("--service-account")
@click.option("--caching/--no-caching", default=None, help="[default: as compiled]")
@click.option("--wait", is_flag=True, help="Follow the run; exit 3 if it fails, 4 on timeout.")
@click.option("--timeout", type=click.FloatRange(min=1), default=3600.0, show_default=True)
@click.option("--poll-interval", type=click.FloatRange(min=0.01), default=10.0)
@connection
def submit_command(package: Path, version_name: str | None, pipeline_name: str,
                   params: tuple[str, ...], experiment: str, run_name: str | None,
                   pipeline_root: str | None, service_account: str | None, caching: bool | None,
                   wait: bool, timeout: float, poll_interval: float,
                   **kw: Any) -> None:  # fmt: skip
    """Create a run from the compiled package (or an uploaded version); --wait follows it."""
    from pipeline import ops

    namespace = kw.get("namespace")
    if version_name is None:
        spec = ops.read_pipeline_spec(package)
        arguments = ops.parse_parameters(params, ops.declared_parameters(spec))
        client = _client(kw)
        source: dict[str, Any] = {"pipeline_package_path": str(package)}
        pipeline_name = ops.pipeline_name_of(spec)
    else:
        client = _client(kw)
        pid, version = ops.resolve_version(client, pipeline_name, version_name)
        arguments = ops.parse_parameters(params, ops.declared_parameters(version.pipeline_spec))
        source = {"pipeline_id": pid, "version_id": version.pipeline_version_id}
    run_name = run_name or ops.default_run_name(pipeline_name, version_name)
    run = ops.call(
        f"create run {run_name!r}", client.run_pipeline,
        experiment_id=ops.experiment_id(client, experiment, namespace),
        job_name=run_name,
        params=arguments, pipeline_root=pipeline_root, service_account=service_account,
        enable_caching=caching, **source,
    )  # fmt: skip
    click.echo(f"created run {run.run_id}: {run.display_name}")
    if wait:
        echo = lambda state: click.echo(f"run state: {state}", err=True)  # noqa: E731
        ops.wait_for_run(client, run.run_id, timeout, poll_interval, echo)
        click.echo(f"run {run.run_id} SUCCEEDED")


@click.group("schedule")
def schedule_group() -> None:
    """Create, list, pause, resume and delete recurring runs of an uploaded pipeline version."""


@schedule_group.command("create")
@click.option("--name", required=True, help="Schedule name; must be unused.")
@click.option("--cron", required=True, help="6 fields, seconds first, e.g. '0 0 2 * * *'.")
@click.option("--version-name", required=True, help="Uploaded pipeline version to run.")
@click.option("--pipeline-name", default=defaults.PIPELINE_NAME, show_default=True)
@param_option
@experiment_option
@click.option("--max-concurrency", type=int, default=1, show_default=True)
@click.option("--catchup/--no-catchup", default=False, show_default=True)
@click.option("--paused", is_flag=True, help="Create it disabled.")
@click.option("--service-account")
@connection
def schedule_create_command(name: str, cron: str, version_name: str, pipeline_name: str,
                            params: tuple[str, ...], experiment: str, max_concurrency: int,
                            catchup: bool, paused: bool, service_account: str | None,
                            **kw: Any) -> None:  # fmt: skip
    """Create a recurring run of a named pipeline version."""
    from pipeline import ops

    cron = ops.validate_cron(cron)  # before connecting: a typo should not need a cluster
    if not 1 <= max_concurrency <= 10:  # the KFP API's bounds
        raise ops.OpsError(f"max_concurrency must be between 1 and 10, got {max_concurrency}")
    namespace = kw.get("namespace")
    client = _client(kw)
    pid, version = ops.resolve_version(client, pipeline_name, version_name)
    arguments = ops.parse_parameters(params, ops.declared_parameters(version.pipeline_spec))
    if ops.find_schedules(client, name, namespace):
        raise ops.OpsError(f"a schedule named {name!r} exists already")
    created = ops.call(
        f"create schedule {name!r}", client.create_recurring_run,
        experiment_id=ops.experiment_id(client, experiment, namespace), job_name=name,
        cron_expression=cron, max_concurrency=max_concurrency, no_catchup=not catchup,
        params=arguments, pipeline_id=pid,
        version_id=version.pipeline_version_id, enabled=not paused,
        service_account=service_account,
    )  # fmt: skip
    click.echo(f"created schedule {created.recurring_run_id}: {name} ({cron})")


@schedule_group.command("list")
@click.option("--pipeline-name", help="Only schedules of this pipeline.")
@connection
def schedule_list_command(pipeline_name: str | None, **kw: Any) -> None:
    """List recurring runs: id, name, mode, cron, max concurrency, catchup, version id."""
    from pipeline import ops

    namespace = kw.get("namespace")
    client = _client(kw)
    schedules = ops.find_schedules(client, None, namespace)
    if pipeline_name is not None:
        pid = ops.find_pipeline(client, pipeline_name)
        if pid is None:
            raise ops.OpsError(f"no pipeline named {pipeline_name!r} on the server")
        refs = [(s, s.pipeline_version_reference) for s in schedules]
        schedules = [s for s, ref in refs if ref and ref.pipeline_id == pid]
    click.echo("ID\tNAME\tMODE\tCRON\tMAX_CONCURRENCY\tCATCHUP\tVERSION_ID")
    for s in schedules:
        cron = s.trigger.cron_schedule.cron if s.trigger and s.trigger.cron_schedule else "-"
        ref = s.pipeline_version_reference
        click.echo(
            f"{s.recurring_run_id}\t{s.display_name}\t{s.mode}\t{cron}\t{s.max_concurrency}\t"
            f"{'no' if s.no_catchup else 'yes'}\t"
            f"{(ref.pipeline_version_id if ref else None) or '-'}"
        )


def _schedule_action(verb: str, method: str) -> click.Command:
    """``schedule <verb> NAME_OR_ID``: kfp.Client's `method` on the schedule found."""

    @click.argument("ref", metavar="NAME_OR_ID")
    @connection
    def command(ref: str, **kw: Any) -> None:
        from pipeline import ops

        namespace = kw.get("namespace")
        client = _client(kw)
        schedule = ops.resolve_schedule(client, ref, namespace)
        sid = schedule.recurring_run_id
        ops.call(f"{verb} schedule {sid}", getattr(client, method), recurring_run_id=sid)
        click.echo(f"{verb}d schedule {sid}: {schedule.display_name}")

    command.__doc__ = f"{verb.capitalize()} the schedule with this name (or id)."
    return click.command(verb)(command)


for _verb, _method in (("pause", "disable"), ("resume", "enable"), ("delete", "delete")):
    schedule_group.add_command(_schedule_action(_verb, f"{_method}_recurring_run"))

COMMANDS: tuple[click.Command, ...] = (
    upload_command,
    submit_command,
    schedule_group,
    version_name_command,
)
