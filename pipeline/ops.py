"""``python -m pipeline upload | submit | schedule | version-name``: the pipeline on a Kubeflow
Pipelines cluster, through a real ``kfp.Client``. Runs in the pipeline's CLI process, on the
user's machine or in CI.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import re
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import click

from components import __version__
from components.common import defaults
from components.common.failure import ExitCode, ExpectedError, InputError
from pipeline.checks import parse_arguments

MAX_CONSECUTIVE_POLL_ERRORS = 3  # transient (5xx, network) errors in a row a wait tolerates


# kfp's own CLI (``kfp pipeline | run | recurring-run``) does the rest (docs/operating.md). What
# this adds: arguments typed and checked by their declarations (`pipeline.checks.parse_arguments`),
# versions named after the commit, a crontab line refused with the 6-field expression it meant, and
# ``--wait`` naming the failed task, with an exit code (`OpsError`).
class OpsError(ExpectedError):
    """An operation on KFP failed: refused (`ExitCode.BAD_INPUT`), the run failed
    (`RUN_FAILED`) or timed out (`TIMED_OUT`), or KFP did not answer (`UNAVAILABLE`: a wait
    retries it)."""


def _arguments(_ctx: Any, _option: Any, pairs: Sequence[str]) -> dict[str, Any]:
    return parse_arguments(pairs)


def call(what: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Call one kfp.Client function; an HTTP or network error becomes one line naming `what`."""
    import kfp_server_api
    import urllib3
    from google.protobuf.json_format import ParseError

    try:
        return fn(*args, **kwargs)
    except kfp_server_api.ApiException as exc:
        detail = exc.body.decode() if isinstance(exc.body, bytes) else exc.body
        with contextlib.suppress(ValueError, AttributeError):  # KFP's JSON error body
            detail = json.loads(detail or "{}").get("message") or detail
        message = f"{what} failed: HTTP {exc.status} {exc.reason or ''}".rstrip()
        code = ExitCode.UNAVAILABLE if exc.status >= 500 else ExitCode.BAD_INPUT
        raise OpsError(f"{message}: {detail or '(no details)'}", code) from exc
    except (urllib3.exceptions.HTTPError, ConnectionError) as exc:
        raise OpsError(f"{what} failed: no answer from KFP ({exc})", ExitCode.UNAVAILABLE) from exc
    except (OSError, ValueError, ParseError) as exc:  # a package missing or not a pipeline, or
        raise OpsError(f"{what} failed: {exc}") from exc  # a name several pipelines have


# KFP's cron (robfig/cron v1) has seconds first, and takes a crontab line (5 fields) as "second,
# minute, hour, day of month, month" with any day of week: `0 2 * * *` would run at minute 2 of
# every hour. So the fields are counted here; the KFP server checks the expression itself.
CRONTAB_FIELDS = ((0, 59), (0, 23), (1, 31), (1, 12), (0, 6))  # minute ... day of week
CRONTAB_ITEM = re.compile(r"^(\*|\?|[A-Za-z]{3}|\d+)(-([A-Za-z]{3}|\d+))?(/[1-9]\d*)?$")


def _crontab_line(fields: Sequence[str]) -> bool:
    """Whether `fields` are valid as the last 5 of a KFP expression, so that a leading seconds
    field makes a valid one: each comma-separated item a value, a range, `*` or `?`, with an
    optional step, its numbers within the field's range. (Just enough for the hint.)"""
    for text, (low, high) in zip(fields, CRONTAB_FIELDS, strict=True):
        for item in text.split(","):
            found = CRONTAB_ITEM.match(item)
            if not found:
                return False
            numbers = [int(n) for n in (found.group(1), found.group(3)) if n and n.isdigit()]
            if not all(low <= n <= high for n in numbers):
                return False
    return True


def validate_cron(expression: str) -> str:
    """`expression` if it has KFP's 6 fields, e.g. ``0 0 2 * * *`` (the server checks them);
    a valid crontab line is refused with the 6-field expression it meant."""
    fields = expression.split()
    if len(fields) != 6:
        meant = len(fields) == 5 and _crontab_line(fields)
        hint = f"; KFP cron has a leading seconds field, did you mean '0 {' '.join(fields)}'?"
        raise InputError(
            f"cron expression {expression!r} has {len(fields)} fields, KFP needs 6: SECOND "
            f"MINUTE HOUR DAY-OF-MONTH MONTH DAY-OF-WEEK{hint if meant else ''}"
        )
    return " ".join(fields)


def git_version_name(repo: str | Path = Path(__file__).parent, version: str = __version__) -> str:
    """``<package version>-g<short commit>[-dirty]`` (git describe: tracked changes only)."""
    describe = ["git", "describe", "--always", "--dirty", "--abbrev=7", "--exclude=*"]
    try:
        commit = subprocess.check_output(describe, cwd=repo, text=True, stderr=subprocess.PIPE)
    except (OSError, subprocess.SubprocessError) as exc:
        why = str(getattr(exc, "stderr", None) or exc).strip()
        raise OpsError(f"git failed in {repo}: {why}; pass --version-name") from exc
    return f"{version}-g{commit.strip()}"


def find_version(client: Any, pipeline: str, version: str) -> tuple[str | None, Any]:
    """``(pipeline id, version)`` of the version named `version`; None for what is missing."""
    pid = call(f"look up pipeline {pipeline!r}", client.get_pipeline_id, pipeline)
    query = {"predicates": [{"operation": 1, "key": "display_name", "stringValue": version}]}
    page = pid and call(
        f"look up version {version!r}",
        client.list_pipeline_versions,
        pid,
        page_size=100,
        filter=json.dumps(query),
    )
    found = [v for v in (page and page.pipeline_versions) or [] if v.display_name == version]
    return pid, found[0] if found else None


def failed_tasks(run: Any) -> str:
    """``failed task(s): name: error; ...`` for the failed leaf tasks of `run`, else its error."""
    details = run.run_details.task_details if run.run_details else None
    failed = [t for t in details or [] if str(t.state or "").upper() == "FAILED"]
    leaves = [t for t in failed if not t.child_tasks] or failed
    found = [(t.display_name or t.task_id, t.error.message if t.error else None) for t in leaves]
    if found:
        return "failed task(s): " + "; ".join(f"{n}: {m}" if m else str(n) for n, m in found)
    return run.error.message if run.error and run.error.message else "no failed task reported"


def wait_for_run(client: Any, run_id: str, timeout: float, poll_interval: float = 10.0) -> Any:
    """Poll run `run_id`, saying each new state, until it ends; return it if SUCCEEDED, else
    raise naming the failed tasks. (kfp.Client's ``wait_for_run_completion`` waits out the
    timeout on CANCELED, stops on the first HTTP 5xx and names no task.)"""
    deadline, errors, state = time.monotonic() + timeout, 0, ""
    while True:
        try:
            run = call(f"get run {run_id}", client.get_run, run_id=run_id)
        except OpsError as exc:
            errors += 1
            if exc.exit_code != ExitCode.UNAVAILABLE or errors > MAX_CONSECUTIVE_POLL_ERRORS:
                raise
        else:
            errors = 0
            if str(run.state or "UNKNOWN").upper() != state:
                state = str(run.state or "UNKNOWN").upper()
                click.echo(f"run state: {state}", err=True)
            if state == "SUCCEEDED":
                return run
            if state in ("FAILED", "SKIPPED", "CANCELED"):
                message = f"run {run_id} ended {state}: {failed_tasks(run)}"
                raise OpsError(message, ExitCode.RUN_FAILED)
        if time.monotonic() >= deadline:
            raise OpsError(
                f"run {run_id} did not finish within {timeout:g} s (last state: "
                f"{state or 'UNKNOWN'})",
                ExitCode.TIMED_OUT,
            )
        time.sleep(max(0.0, min(poll_interval, deadline - time.monotonic())))


def connection(func: Callable[..., Any]) -> Callable[..., Any]:
    """`connect`'s options, each also read from kfp's own environment variable."""
    for option, envvar in [
        ("--sa-token-path", "SA_TOKEN_PATH"),
        ("--token", "TOKEN"),
        ("--namespace", "NAMESPACE"),
        ("--host", "ENDPOINT"),
    ]:
        func = click.option(option, envvar=f"KF_PIPELINES_{envvar}", show_envvar=True)(func)
    return func


def connect(
    host: str | None, namespace: str | None, token: str | None, sa_token_path: str | None
) -> Any:
    """A ``kfp.Client`` (no `host`: in-cluster or kubeconfig), with a token or a token file."""
    import kfp
    from kfp.client.set_volume_credentials import ServiceAccountTokenVolumeCredentials

    path = None if token else sa_token_path
    credentials = ServiceAccountTokenVolumeCredentials(path) if path else None
    return call(
        f"connect to KFP at {host or '(auto)'}",
        kfp.Client,
        host=host,
        namespace=namespace or "kubeflow",
        existing_token=token,
        credentials=credentials,
    )


pipeline_option = click.option("--pipeline-name", default=defaults.PIPELINE_NAME, show_default=True)
param_option = click.option(
    "--param",
    "params",
    multiple=True,
    metavar="NAME=VALUE",
    callback=_arguments,
    help="Typed by its declaration.",
)
experiment_option = click.option("--experiment", default="Default", show_default=True)


def _target(
    client: Any, package: str | None, pipeline: str, version: str | None, experiment: str
) -> dict[str, Any]:
    """What a run or schedule runs (the package, or the uploaded `version` of `pipeline`), and
    in which `experiment` (created when missing)."""
    target: dict[str, Any] = {"pipeline_package_path": package or "build/pipeline.yaml"}
    if version is not None:
        pid, found = find_version(client, pipeline, version)
        if found is None:
            missing = f"has no version named {version!r}" if pid else "is not on the server"
            raise OpsError(f"pipeline {pipeline!r} {missing}; upload it first")
        target = {"pipeline_id": pid, "version_id": found.pipeline_version_id}
    experiment_id = call(f"experiment {experiment!r}", client.create_experiment, experiment)
    return {"experiment_id": experiment_id.experiment_id, **target}


@click.command("version-name")
def version_name_command() -> None:
    """Print the pipeline version name of this checkout: <package version>-g<commit>[-dirty]."""
    click.echo(git_version_name())


@click.command("upload")
@click.option(
    "--package",
    type=click.Path(exists=True, dir_okay=False),
    default="build/pipeline.yaml",
    show_default=True,
)
@pipeline_option
@click.option("--version-name", help="[default: <package version>-g<commit>[-dirty]]")
@click.option("--reuse-existing", is_flag=True, help="Keep an existing version and succeed.")
@connection
def upload_command(
    package: str, pipeline_name: str, version_name: str | None, reuse_existing: bool, **kw: Any
) -> None:
    """Create the pipeline (empty, so that every version carries the commit's name) or add a
    version to it, from the compiled package."""
    name = version_name or git_version_name()
    client = connect(**kw)
    pid, found = find_version(client, pipeline_name, name)
    if found is not None and not reuse_existing:
        raise OpsError(
            f"pipeline {pipeline_name!r} already has a version named {name!r}; "
            "commit, pass another --version-name, or --reuse-existing"
        )
    if pid is None:
        create = client.pipelines.pipeline_service_create_pipeline
        pid = call(
            f"create pipeline {pipeline_name!r}", create, {"display_name": pipeline_name}
        ).pipeline_id
    what, upload = "kept existing" if found else "uploaded", client.upload_pipeline_version
    found = found or call(
        f"upload version {name!r} of pipeline {pipeline_name!r}",
        upload,
        package,
        name,
        pipeline_id=pid,
    )
    click.echo(f"{what} version {name} ({found.pipeline_version_id}) of {pipeline_name} ({pid})")


@click.command("submit")
@click.option(
    "--package", type=click.Path(exists=True, dir_okay=False), help="[default: build/pipeline.yaml]"
)
@click.option("--version-name", help="Run this uploaded version instead of the package.")
@pipeline_option
@param_option
@experiment_option
@click.option("--run-name", help="[default: <pipeline> <version> <UTC time>]")
@click.option(
    "--wait",
    is_flag=True,
    help=f"Follow the run; exit {ExitCode.RUN_FAILED:d} if it "
    f"fails, {ExitCode.TIMED_OUT:d} on timeout.",
)
@click.option("--timeout", type=click.FloatRange(min=1), default=3600.0, show_default=True)
@connection
def submit_command(
    package: str | None,
    version_name: str | None,
    pipeline_name: str,
    params: dict[str, Any],
    experiment: str,
    run_name: str | None,
    wait: bool,
    timeout: float,
    **kw: Any,
) -> None:
    """Create a run of the compiled package (or of an uploaded version); --wait follows it."""
    client = connect(**kw)
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    run_name = run_name or " ".join(filter(None, (pipeline_name, version_name, stamp)))
    run = call(
        f"create run {run_name!r}",
        client.run_pipeline,
        job_name=run_name,
        params=params,
        **_target(client, package, pipeline_name, version_name, experiment),
    )
    click.echo(f"created run {run.run_id}: {run.display_name}")
    if wait:
        wait_for_run(client, run.run_id, timeout)
        click.echo(f"run {run.run_id} SUCCEEDED")


@click.command("schedule")
@click.option("--name", required=True, help="The schedule's name; unused in the experiment.")
@click.option(
    "--cron",
    required=True,
    callback=lambda _ctx, _opt, cron: validate_cron(cron),
    help="6 fields, seconds first, e.g. '0 0 2 * * *'.",
)
@click.option("--version-name", required=True, help="The uploaded version to run.")
@pipeline_option
@param_option
@experiment_option
@click.option("--max-concurrency", type=click.IntRange(1, 10), default=1, show_default=True)
@click.option("--catchup/--no-catchup", default=False, show_default=True)
@connection
def schedule_command(
    name: str,
    cron: str,
    version_name: str,
    pipeline_name: str,
    params: dict[str, Any],
    experiment: str,
    max_concurrency: int,
    catchup: bool,
    **kw: Any,
) -> None:
    """Create a recurring run of an uploaded version (list, pause, delete: kfp recurring-run)."""
    client = connect(**kw)
    target = _target(client, None, pipeline_name, version_name, experiment)
    created = call(
        f"create schedule {name!r}",
        client.create_recurring_run,
        job_name=name,
        cron_expression=cron,
        max_concurrency=max_concurrency,
        no_catchup=not catchup,
        params=params,
        **target,
    )
    click.echo(f"created schedule {created.recurring_run_id}: {name} ({cron})")


COMMANDS = (upload_command, submit_command, schedule_command, version_name_command)
