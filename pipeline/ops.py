"""Operating the pipeline on a Kubeflow Pipelines (v2) cluster: upload, submit, wait, schedule.

Plain functions over a real ``kfp.Client``; ``pipeline/ops_cli.py`` is the click layer. What
this adds to kfp.Client: versions named after the commit, pipeline parameters typed by the
compiled spec, a cron check that names the field, and a wait that names the failed task.
Every failure is an :class:`OpsError` whose message says what was wrong.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import click
import kfp
import kfp_server_api
import urllib3
import yaml

from components import __version__

PROJECT_ROOT = Path(__file__).resolve().parents[1]
TERMINAL_STATES = frozenset({"SUCCEEDED", "FAILED", "SKIPPED", "CANCELED"})
MAX_CONSECUTIVE_POLL_ERRORS = 3  # transient (5xx, network) errors in a row a wait tolerates


class OpsError(click.ClickException):
    """An operation failed (exit 1); `status` is KFP's HTTP status, `transient` true for
    HTTP 5xx and network errors."""

    def __init__(self, message: str, status: int | None = None, transient: bool = False) -> None:
        super().__init__(message)
        self.status, self.transient = status, transient


class RunFailedError(OpsError):
    """The run finished FAILED, CANCELED or SKIPPED (exit 3)."""

    exit_code = 3


class RunTimeoutError(OpsError):
    """The run did not finish within the allowed time (exit 4)."""

    exit_code = 4


def call(what: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Call one kfp.Client function; turn HTTP and network errors into :class:`OpsError`."""
    try:
        return fn(*args, **kwargs)
    except kfp_server_api.ApiException as exc:
        detail = exc.body.decode() if isinstance(exc.body, bytes) else exc.body
        with contextlib.suppress(ValueError, AttributeError):
            detail = json.loads(detail or "{}").get("message") or detail
        message = f"{what} failed: HTTP {exc.status} {exc.reason or ''}".rstrip()
        message += f": {detail or '(no details)'}"
        raise OpsError(message, exc.status, transient=exc.status >= 500) from exc
    except (urllib3.exceptions.HTTPError, OSError) as exc:
        raise OpsError(f"{what} failed: no answer from KFP ({exc})", transient=True) from exc


def connect(
    host: str | None, namespace: str | None, token: str | None, sa_token: str | None
) -> kfp.Client:
    """Return a ``kfp.Client``: `host` None means in-cluster or kubeconfig; `token` a bearer
    token, `sa_token` a projected service-account token file."""
    credentials = None
    if sa_token and not token:
        from kfp.client.set_volume_credentials import ServiceAccountTokenVolumeCredentials

        credentials = ServiceAccountTokenVolumeCredentials(path=sa_token)
    return call(
        f"connect to KFP at {host or '(auto)'}",
        kfp.Client,
        host=host.rstrip("/") if host else None,
        namespace=namespace or "kubeflow",
        existing_token=token,
        credentials=credentials,
    )


def read_pipeline_spec(package_path: str | Path) -> dict[str, Any]:
    """Return the PipelineSpec (first YAML document) of a compiled pipeline package."""
    path = Path(package_path)
    if not path.is_file():
        raise OpsError(f"pipeline package {path} does not exist; compile it first")
    try:
        spec = next(yaml.safe_load_all(path.read_text()), None)
    except yaml.YAMLError as exc:
        raise OpsError(f"pipeline package {path} is not valid YAML: {exc}") from exc
    if not isinstance(spec, dict) or "root" not in spec or "pipelineInfo" not in spec:
        raise OpsError(f"{path} is not a compiled KFP v2 pipeline (no 'root', 'pipelineInfo')")
    return spec


def _unwrap(spec: Mapping[str, Any]) -> Mapping[str, Any]:
    """A version's spec may be wrapped as ``{"pipeline_spec": ..., "platform_spec": ...}``."""
    return spec["pipeline_spec"] if "root" not in spec and "pipeline_spec" in spec else spec


def pipeline_name_of(spec: Mapping[str, Any]) -> str:
    """Return the pipeline name a compiled spec declares (``pipelineInfo.name``)."""
    return str(_unwrap(spec)["pipelineInfo"]["name"])


def declared_parameters(spec: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """Return the pipeline's input parameters (``root.inputDefinitions.parameters``)."""
    return dict(_unwrap(spec)["root"].get("inputDefinitions", {}).get("parameters", {}))


_TYPES: dict[str, Any] = {"NUMBER_INTEGER": int, "NUMBER_DOUBLE": (int, float),
                          "BOOLEAN": bool, "LIST": list, "STRUCT": dict}  # fmt: skip


def _coerce(name: str, kind: str, raw: str) -> Any:
    """Convert `raw` to KFP parameter type `kind`: strings as given, the rest as JSON."""
    if kind not in _TYPES:
        return raw
    words = {"yes": True, "no": False, "1": True, "0": False, "true": True, "false": False}
    try:
        value = (
            words[raw.strip().lower()]
            if kind == "BOOLEAN" and raw.strip().lower() in words
            else json.loads(raw)
        )
    except ValueError:
        value = None
    if not isinstance(value, _TYPES[kind]) or (kind.startswith("NUMBER") and value is True):
        raise OpsError(f"parameter {name!r} is declared {kind} but got {raw!r}")
    return float(value) if kind == "NUMBER_DOUBLE" else value


def parse_parameters(pairs: Sequence[str], declared: Mapping[str, Any]) -> dict[str, Any]:
    """Parse ``NAME=VALUE`` strings into arguments typed by `declared`; name every bad one."""
    values: dict[str, Any] = {}
    for pair in pairs:
        name, sep, raw = pair.partition("=")
        if not sep or not name.strip():
            raise OpsError(f"bad parameter {pair!r}: expected NAME=VALUE")
        if name in values:
            raise OpsError(f"parameter {name!r} is given more than once")
        values[name] = raw
    unknown = sorted(set(values) - set(declared))
    if unknown:
        known = ", ".join(sorted(declared)) or "(none)"
        raise OpsError(
            f"unknown pipeline parameter(s): {', '.join(unknown)}; the pipeline declares: {known}"
        )
    required = (
        n for n, d in declared.items() if not d.get("isOptional") and "defaultValue" not in d
    )
    missing = sorted(n for n in required if n not in values)
    if missing:
        raise OpsError(f"missing required pipeline parameter(s): {', '.join(missing)}")
    return {n: _coerce(n, declared[n].get("parameterType", "STRING"), v) for n, v in values.items()}


# KFP parses cron with robfig/cron v1, seconds first; a 5-field crontab line is accepted there
# as "second 0, minute 2, every hour", so the field count and each field are checked here.
_CRON_FIELDS = (
    ("second", 0, 59, ()),
    ("minute", 0, 59, ()),
    ("hour", 0, 23, ()),
    ("day of month", 1, 31, ()),
    (
        "month",
        1,
        12,
        (["JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC"]),
    ),
    ("day of week", 0, 6, (["SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"])),
)


def _cron_value(field: str, text: str, low: int, names: Sequence[str], high: int) -> int:
    """Return the number `text` stands for in cron field `field`, checked against its range."""
    if text.upper() in names:
        return names.index(text.upper()) + low
    if not text.isdigit():
        raise OpsError(f"cron {field} field: {text!r} is not a number")
    if not low <= int(text) <= high:
        raise OpsError(f"cron {field} field: {text} is out of range {low}-{high}")
    return int(text)


def validate_cron(expression: str) -> str:
    """Return `expression` normalised if it is a 6-field KFP cron expression, else raise.

    ``SECOND MINUTE HOUR DAY-OF-MONTH MONTH DAY-OF-WEEK``, e.g. ``0 0 2 * * *``; each field
    takes ``*``, ``?`` (day fields), numbers, names, ranges ``a-b``, steps ``/n`` and lists.
    """
    fields = expression.split()
    if len(fields) != 6:
        hint = "; KFP cron has a leading seconds field, did you mean"
        hint = f"{hint} '0 {' '.join(fields)}'?" if len(fields) == 5 else ""
        raise OpsError(
            f"cron expression {expression!r} has {len(fields)} fields, KFP needs 6: "
            f"SECOND MINUTE HOUR DAY-OF-MONTH MONTH DAY-OF-WEEK{hint}"
        )
    for text, (field, low, high, names) in zip(fields, _CRON_FIELDS, strict=True):
        for part in text.split(","):
            if not part:
                raise OpsError(f"cron {field} field {text!r} has an empty list item")
            span, slash, step = part.partition("/")
            if slash and (not step.isdigit() or int(step) == 0):
                raise OpsError(f"cron {field} field: step {step!r} must be a positive number")
            if span == "?" and not field.startswith("day"):
                raise OpsError(f"cron {field} field: '?' is only allowed in the day fields")
            if span in ("*", "?"):
                continue
            first, dash, last = span.partition("-")
            start = _cron_value(field, first, low, names, high)
            if dash and _cron_value(field, last, low, names, high) < start:
                raise OpsError(f"cron {field} field: range {span!r} runs backwards")
    return " ".join(fields)


def git_version_name(repo: str | Path = PROJECT_ROOT, package_version: str = __version__) -> str:
    """Return ``<package version>-g<short commit>[-dirty]`` (tracked changes only)."""

    def git(*args: str) -> str:
        try:
            done = subprocess.run(
                ["git", *args], cwd=repo, capture_output=True, text=True, timeout=30
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            done = subprocess.CompletedProcess(args, 1, "", str(exc))
        if done.returncode != 0:
            raise OpsError(f"git failed in {repo}: {done.stderr.strip()}; pass --version-name")
        return done.stdout.strip()

    commit = git("rev-parse", "--short=7", "HEAD")
    dirty = git("status", "--porcelain", "--untracked-files=no")
    return f"{package_version}-g{commit}" + ("-dirty" if dirty else "")


def _named(what: str, lister: Callable[..., Any], field: str, name: str, **kw: Any) -> list[Any]:
    """The objects `lister` returns whose display name is `name` (the server filters)."""
    query = {"predicates": [{"operation": 1, "key": "display_name", "stringValue": name}]}
    page = call(f"look up {what}", lister, page_size=100, filter=json.dumps(query), **kw)
    return [item for item in getattr(page, field) or [] if item.display_name == name]


def find_pipeline(client: kfp.Client, name: str) -> str | None:
    """Return the id of the pipeline named `name` (kfp.Client's look-up), or ``None``."""
    try:
        return call(f"look up pipeline {name!r}", client.get_pipeline_id, name)
    except ValueError as exc:  # kfp.Client's answer when several pipelines have that name
        raise OpsError(f"look up pipeline {name!r}: {exc}") from exc


def _version(client: kfp.Client, pipeline_id: str, name: str) -> Any | None:
    """Return the version of pipeline `pipeline_id` named `name`, or ``None``."""
    found = _named("version", client.list_pipeline_versions, "pipeline_versions", name,
                   pipeline_id=pipeline_id)  # fmt: skip
    return found[0] if found else None


def upload(
    client: kfp.Client, package: Path, version: str, pipeline: str | None, reuse: bool = False
) -> tuple[str, str, bool]:
    """Upload `package` as version `version`; return (pipeline id, version id, uploaded).

    A missing pipeline is created empty first, so that every version, the first included,
    carries `version`. An existing version is an error unless `reuse`.
    """
    name = pipeline or pipeline_name_of(read_pipeline_spec(package))
    pid = find_pipeline(client, name)
    if pid is None:
        body = kfp_server_api.V2beta1Pipeline(display_name=name)
        create = client.pipelines.pipeline_service_create_pipeline
        pid = call(f"create pipeline {name!r}", create, body).pipeline_id
    elif (existing := _version(client, pid, version)) is not None:
        if not reuse:
            raise OpsError(
                f"pipeline {name!r} already has a version named {version!r}; commit your "
                "change, pass another --version-name, or --reuse-existing to keep it"
            )
        return pid, existing.pipeline_version_id, False
    uploaded = call(f"upload version {version!r} of pipeline {name!r}",
                    client.upload_pipeline_version, str(package), version,
                    pipeline_id=pid)  # fmt: skip
    return pid, uploaded.pipeline_version_id, True


def resolve_version(client: kfp.Client, pipeline: str, version: str) -> tuple[str, Any]:
    """Return ``(pipeline id, version)`` for the named version, with its pipeline spec."""
    pid = find_pipeline(client, pipeline)
    if pid is None:
        raise OpsError(f"no pipeline named {pipeline!r} on the server; upload it first", 404)
    found = _version(client, pid, version)
    if found is None:
        raise OpsError(f"pipeline {pipeline!r} has no version named {version!r}", 404)
    return pid, call("get version", client.get_pipeline_version, pid, found.pipeline_version_id)


def experiment_id(client: kfp.Client, name: str, namespace: str | None = None) -> str:
    """Return the id of experiment `name`, created when missing."""
    return str(
        call(
            f"experiment {name!r}", client.create_experiment, name, namespace=namespace
        ).experiment_id
    )


def default_run_name(pipeline_name: str, version_name: str | None = None) -> str:
    """Return ``<pipeline> <version> <UTC time>``, the run name when none is given."""
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    return " ".join(part for part in (pipeline_name, version_name, stamp) if part)


def failed_tasks(run: Any) -> list[str]:
    """Return ``name: error`` for each failed leaf task of `run` (its DAGs only if none)."""
    details = run.run_details.task_details if run.run_details else None
    failed = [t for t in details or [] if str(t.state or "").upper() == "FAILED"]
    leaves = [t for t in failed if not t.child_tasks] or failed
    named = [(t.display_name or t.task_id, t.error.message if t.error else None) for t in leaves]
    return [f"{label}: {message}" if message else str(label) for label, message in named]


def wait_for_run(
    client: kfp.Client,
    run_id: str,
    timeout: float,
    poll_interval: float = 10.0,
    on_state: Callable[[str], None] = lambda state: None,
) -> Any:
    """Poll run `run_id` until it ends; return it if SUCCEEDED, else raise naming the tasks.

    kfp.Client's ``wait_for_run_completion`` would wait out the timeout on CANCELED and stop
    on the first HTTP 5xx; here up to MAX_CONSECUTIVE_POLL_ERRORS transient errors are retried.
    """
    deadline, errors, state = time.monotonic() + timeout, 0, "UNKNOWN"
    while True:
        try:
            run = call(f"get run {run_id}", client.get_run, run_id=run_id)
            errors = 0
            if str(run.state or "UNKNOWN").upper() != state:
                state = str(run.state or "UNKNOWN").upper()
                on_state(state)
        except OpsError as exc:
            errors += 1
            if not exc.transient or errors > MAX_CONSECUTIVE_POLL_ERRORS:
                raise
        if state == "SUCCEEDED":
            return run
        if state in TERMINAL_STATES:
            tasks = failed_tasks(run)
            error = run.error.message if run.error else "no failed task reported"
            reason = f"failed task(s): {'; '.join(tasks)}" if tasks else error
            raise RunFailedError(f"run {run_id} ended {state}: {reason}")
        if time.monotonic() >= deadline:
            raise RunTimeoutError(
                f"run {run_id} did not finish within {timeout:g} s (last state: {state})"
            )
        time.sleep(max(0.0, min(poll_interval, deadline - time.monotonic())))


def find_schedules(client: kfp.Client, name: str | None, namespace: str | None) -> list[Any]:
    """Return the recurring runs named `name` (the first 200 of all when `name` is None)."""
    if name is not None:
        return _named("schedule", client.list_recurring_runs, "recurring_runs", name,
                      namespace=namespace)  # fmt: skip
    page = call("list schedules", client.list_recurring_runs, page_size=200, namespace=namespace)
    return list(page.recurring_runs or [])


def resolve_schedule(client: kfp.Client, ref: str, namespace: str | None = None) -> Any:
    """Return the recurring run named `ref`, else the one whose id is `ref`."""
    found = find_schedules(client, ref, namespace)
    if len(found) > 1:
        raise OpsError(f"several schedules are named {ref!r}; give the id instead")
    if found:
        return found[0]
    try:
        return call(f"get schedule {ref}", client.get_recurring_run, recurring_run_id=ref)
    except OpsError as exc:
        if exc.status != 404:
            raise
        raise OpsError(f"no schedule named or with id {ref!r}") from exc
