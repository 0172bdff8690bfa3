"""Operating the pipeline on a Kubeflow Pipelines (v2) cluster: upload, submit, wait, schedule.

Plain functions over a real ``kfp.Client``; ``pipeline/ops_cli.py`` is the thin click layer.
Every failure is raised as :class:`OpsError` (or a subclass) with a message that names what
was wrong: the parameter, the pipeline, the version, the run's failed task, the HTTP status.

Connecting (see :func:`connect`): the host, namespace and credentials are passed in explicitly;
the CLI fills them from flags or the usual environment variables at call time
(``KF_PIPELINES_ENDPOINT``, ``KF_PIPELINES_NAMESPACE``, ``KF_PIPELINES_TOKEN``,
``KF_PIPELINES_SA_TOKEN_PATH``). Nothing here reads the environment at import time.
"""

from __future__ import annotations

import datetime
import json
import re
import subprocess
import time
import urllib.error
import urllib.request
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import kfp
import kfp_server_api
import urllib3
import yaml

from components import __version__

PROJECT_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_PACKAGE = Path("build/pipeline.yaml")
DEFAULT_PIPELINE_NAME = "kfp-horovod-mnist"
DEFAULT_EXPERIMENT = "Default"
DEFAULT_REQUEST_TIMEOUT_S = 30.0

# Run states (kfp_server_api.V2beta1RuntimeState) after which a run will not change any more.
TERMINAL_STATES = frozenset({"SUCCEEDED", "FAILED", "SKIPPED", "CANCELED"})
SUCCESS_STATES = frozenset({"SUCCEEDED"})
# How many consecutive transient errors (HTTP 5xx, network) `wait_for_run` tolerates.
MAX_CONSECUTIVE_POLL_ERRORS = 3
# KFP's scheduled workflow controller allows 1..10 concurrent runs per recurring run.
MAX_CONCURRENCY_LIMIT = 10
_PAGE_SIZE = 100


class OpsError(Exception):
    """An operation against KFP (or its input) failed; the message says what and why.

    `status` is the HTTP status KFP answered with, if any; `transient` is true for HTTP 5xx and
    for network errors (no answer, timeout), which may succeed when tried again.
    """

    def __init__(self, message: str, status: int | None = None, transient: bool = False) -> None:
        super().__init__(message)
        self.status = status
        self.transient = transient


class NotFoundError(OpsError):
    """A named pipeline, version, experiment, run or schedule does not exist."""


class AlreadyExistsError(OpsError):
    """The thing to create exists already (HTTP 409, or found before creating)."""


class ParameterError(OpsError):
    """A pipeline parameter given on the command line is unknown, missing or of the wrong type."""


class CronError(OpsError):
    """A cron expression is not a valid 6-field (seconds first) KFP cron expression."""


class RunFailedError(OpsError):
    """The run finished in a state other than SUCCEEDED."""

    def __init__(self, message: str, run_id: str, state: str, failed_tasks: list[str]) -> None:
        super().__init__(message)
        self.run_id = run_id
        self.state = state
        self.failed_tasks = failed_tasks


class RunTimeoutError(OpsError):
    """The run did not finish within the allowed time."""

    def __init__(self, message: str, run_id: str, state: str) -> None:
        super().__init__(message)
        self.run_id = run_id
        self.state = state


# --------------------------------------------------------------------------------------------
# Connecting
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class KfpSettings:
    """How to reach and authenticate to the KFP API.

    host: API endpoint, e.g. ``http://localhost:8888`` (a port-forward of ``svc/ml-pipeline``)
        or ``https://kubeflow.example.com/pipeline``. ``None`` lets kfp.Client find the API
        itself: the in-cluster service when running in a pod, else the current kubeconfig
        context through the Kubernetes API server's service proxy.
    namespace: the user's profile namespace on a multi-user deployment; ``None`` on a
        single-user (standalone) deployment.
    token: a bearer token obtained outside the SDK (kfp.Client's ``existing_token``).
    sa_token_path: a projected service-account token file, re-read on every request (kfp's
        ``ServiceAccountTokenVolumeCredentials``); for pods talking to a multi-user KFP.
    request_timeout: seconds to wait for connect and for each response before giving up.
    """

    host: str | None = None
    namespace: str | None = None
    token: str | None = None
    sa_token_path: str | None = None
    request_timeout: float = DEFAULT_REQUEST_TIMEOUT_S


def normalize_host(host: str) -> str:
    """Return `host` with a scheme (``https://`` when none is given) and no trailing slash."""
    host = host.strip()
    if not host:
        raise OpsError("the KFP host is empty; pass --host or set KF_PIPELINES_ENDPOINT")
    if not re.match(r"^https?://", host):
        host = "https://" + host
    return host.rstrip("/")


def _bearer_token(settings: KfpSettings) -> str | None:
    """Return the bearer token `settings` authenticate with, reading the token file if any."""
    if settings.token:
        return settings.token
    if settings.sa_token_path:
        try:
            return Path(settings.sa_token_path).read_text().strip()
        except OSError as exc:
            raise OpsError(
                f"cannot read the service-account token file {settings.sa_token_path}: {exc}"
            ) from exc
    return None


def check_health(settings: KfpSettings) -> dict[str, Any]:
    """GET ``/apis/v2beta1/healthz`` once, with a timeout, and return its JSON.

    kfp.Client calls healthz from its constructor (when no namespace is set) with five retries
    five seconds apart and no timeout; this check fails fast, with a clear message, instead.
    """
    if not settings.host:
        raise OpsError("check_health needs a host")
    url = normalize_host(settings.host) + "/apis/v2beta1/healthz"
    request = urllib.request.Request(url, method="GET")
    token = _bearer_token(settings)
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=settings.request_timeout) as response:
            body = response.read()
    except urllib.error.HTTPError as exc:
        detail = _error_detail(exc.read())
        hint = " (check the token)" if exc.code in (401, 403) else ""
        raise OpsError(
            f"KFP at {settings.host} is not healthy: HTTP {exc.code} {exc.reason} from "
            f"{url}{hint}: {detail}"
        ) from exc
    except (urllib.error.URLError, TimeoutError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise OpsError(f"cannot reach KFP at {settings.host} ({url}): {reason}") from exc
    try:
        parsed = json.loads(body or b"{}")
    except ValueError as exc:
        raise OpsError(
            f"{url} did not answer with JSON; is {settings.host} the KFP API endpoint "
            f"(not the UI)? got: {body[:200]!r}"
        ) from exc
    return parsed if isinstance(parsed, dict) else {}


def connect(settings: KfpSettings) -> kfp.Client:
    """Return a ``kfp.Client`` for `settings`, after a fast health check when a host is given.

    Every request the client makes afterwards times out after ``settings.request_timeout``.
    """
    if settings.host:
        check_health(settings)
    credentials = None
    if settings.sa_token_path and not settings.token:
        from kfp.client.set_volume_credentials import ServiceAccountTokenVolumeCredentials

        credentials = ServiceAccountTokenVolumeCredentials(path=settings.sa_token_path)
    try:
        with warnings.catch_warnings():
            # "This client only works with Kubeflow Pipeline v2.0.0-beta.2 and later versions."
            warnings.simplefilter("ignore", FutureWarning)
            client = kfp.Client(
                host=normalize_host(settings.host) if settings.host else None,
                namespace=settings.namespace or "kubeflow",
                existing_token=settings.token or None,
                credentials=credentials,
            )
    except (urllib3.exceptions.HTTPError, TimeoutError) as exc:
        raise OpsError(f"cannot connect to KFP at {settings.host or '(auto)'}: {exc}") from exc
    _set_request_timeout(client, settings.request_timeout)
    return client


def _set_request_timeout(client: kfp.Client, seconds: float) -> None:
    """Make every request of `client` time out after `seconds` (kfp.Client has no such option).

    All of kfp.Client's service APIs share one generated ``ApiClient``; its REST client takes a
    per-request ``_request_timeout`` that kfp.Client never passes, so it is filled in here.
    """
    rest = client._run_api.api_client.rest_client
    original = rest.request
    timeout = (float(seconds), float(seconds))  # (connect, read); a float alone is ignored

    def request(*args: Any, _request_timeout: Any = None, **kwargs: Any) -> Any:
        return original(*args, _request_timeout=_request_timeout or timeout, **kwargs)

    rest.request = request


# --------------------------------------------------------------------------------------------
# Calling the API with clear errors
# --------------------------------------------------------------------------------------------


def _error_detail(body: bytes | str | None) -> str:
    """Return the human part of a KFP error body (``{"error"|"message": ...}``), else the body."""
    if not body:
        return "(no details)"
    text = body.decode("utf-8", "replace") if isinstance(body, bytes) else body
    try:
        parsed = json.loads(text)
    except ValueError:
        return text.strip()[:500]
    if isinstance(parsed, dict):
        for key in ("message", "error"):
            if parsed.get(key):
                return str(parsed[key])
    return text.strip()[:500]


def _call(what: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Call one KFP API function; turn HTTP and network errors into :class:`OpsError`.

    `what` names the operation in the message ("upload version 0.1.0-g1a2b3c4 of pipeline x").
    404 becomes :class:`NotFoundError` and 409 :class:`AlreadyExistsError`.
    """
    try:
        return fn(*args, **kwargs)
    except kfp_server_api.ApiException as exc:
        status = exc.status
        detail = _error_detail(exc.body) if exc.body else (exc.reason or "(no details)")
        message = f"{what} failed: HTTP {status} {exc.reason or ''}".rstrip() + f": {detail}"
        if status == 404:
            raise NotFoundError(message, status) from exc
        if status == 409:
            raise AlreadyExistsError(message, status) from exc
        raise OpsError(message, status, transient=bool(status and status >= 500)) from exc
    except urllib3.exceptions.HTTPError as exc:
        raise OpsError(
            f"{what} failed: no answer from KFP ({type(exc).__name__}: {exc})", transient=True
        ) from exc


def _equals_filter(key: str, value: str) -> str:
    """Return a KFP v2beta1 list filter selecting items whose `key` equals `value`."""
    # The same shape kfp.Client.get_pipeline_id sends (operation 1 is EQUALS).
    return json.dumps({"predicates": [{"operation": 1, "key": key, "stringValue": value}]})


def _pages(fetch: Callable[[str], Any], items_attr: str) -> Iterator[Any]:
    """Yield every item of a paginated KFP list call; `fetch(page_token)` returns one page."""
    token = ""
    while True:
        page = fetch(token)
        yield from getattr(page, items_attr, None) or []
        token = getattr(page, "next_page_token", None) or ""
        if not token:
            return


# --------------------------------------------------------------------------------------------
# Package, parameters, version name
# --------------------------------------------------------------------------------------------


def read_pipeline_spec(package_path: str | Path) -> dict[str, Any]:
    """Return the PipelineSpec (first YAML document) of a compiled pipeline package."""
    path = Path(package_path)
    if not path.is_file():
        raise OpsError(
            f"pipeline package {path} does not exist; compile it first "
            "(python -m pipeline compile --output build/pipeline.yaml)"
        )
    if path.suffix not in (".yaml", ".yml"):
        raise OpsError(f"pipeline package {path} must be a .yaml or .yml file")
    try:
        docs = list(yaml.safe_load_all(path.read_text()))
    except yaml.YAMLError as exc:
        raise OpsError(f"pipeline package {path} is not valid YAML: {exc}") from exc
    spec = docs[0] if docs else None
    if not isinstance(spec, dict) or "root" not in spec or "pipelineInfo" not in spec:
        raise OpsError(
            f"{path} is not a compiled KFP v2 pipeline (no 'root' and 'pipelineInfo' sections)"
        )
    return spec


def _unwrap_spec(spec: Mapping[str, Any]) -> Mapping[str, Any]:
    """Return the PipelineSpec from a version's ``pipeline_spec`` (maybe wrapped with a
    platform spec as ``{"pipeline_spec": ..., "platform_spec": ...}``)."""
    if "root" not in spec and isinstance(spec.get("pipeline_spec"), Mapping):
        return spec["pipeline_spec"]
    return spec


def pipeline_name_of(spec: Mapping[str, Any]) -> str:
    """Return the pipeline name a compiled spec declares (``pipelineInfo.name``)."""
    name = _unwrap_spec(spec).get("pipelineInfo", {}).get("name")
    if not name:
        raise OpsError("the pipeline spec has no pipelineInfo.name")
    return str(name)


@dataclass(frozen=True)
class ParameterDecl:
    """One declared pipeline input parameter."""

    name: str
    type: str  # STRING, NUMBER_INTEGER, NUMBER_DOUBLE, BOOLEAN, LIST, STRUCT
    required: bool


def declared_parameters(spec: Mapping[str, Any]) -> dict[str, ParameterDecl]:
    """Return the pipeline's input parameters from ``root.inputDefinitions.parameters``."""
    params = _unwrap_spec(spec).get("root", {}).get("inputDefinitions", {}).get("parameters", {})
    declared = {}
    for name, decl in (params or {}).items():
        required = not decl.get("isOptional", False) and "defaultValue" not in decl
        declared[name] = ParameterDecl(name, str(decl.get("parameterType", "STRING")), required)
    return declared


_TRUE = {"true", "1", "yes", "y", "on"}
_FALSE = {"false", "0", "no", "n", "off"}


def coerce_parameter(decl: ParameterDecl, raw: str) -> Any:
    """Convert the command-line string `raw` to the Python value `decl` declares."""
    kind = decl.type
    try:
        if kind == "NUMBER_INTEGER":
            return int(raw)
        if kind == "NUMBER_DOUBLE":
            return float(raw)
        if kind == "BOOLEAN":
            lowered = raw.strip().lower()
            if lowered in _TRUE:
                return True
            if lowered in _FALSE:
                return False
            raise ValueError("expected true or false")
        if kind in ("LIST", "STRUCT"):
            value = json.loads(raw)
            wanted = list if kind == "LIST" else dict
            if not isinstance(value, wanted):
                raise ValueError(f"expected a JSON {'array' if kind == 'LIST' else 'object'}")
            return value
    except ValueError as exc:
        raise ParameterError(
            f"parameter {decl.name!r} is declared {kind} but got {raw!r}: {exc}"
        ) from exc
    return raw


def parse_parameters(
    pairs: Sequence[str], declared: Mapping[str, ParameterDecl], *, check_required: bool = True
) -> dict[str, Any]:
    """Parse ``k=v`` strings into typed pipeline arguments, checked against `declared`.

    Unknown names, duplicates, malformed pairs and (with `check_required`) missing required
    parameters are errors that name every offending parameter.
    """
    values: dict[str, Any] = {}
    unknown: list[str] = []
    for pair in pairs:
        name, sep, raw = pair.partition("=")
        name = name.strip()
        if not sep or not name:
            raise ParameterError(f"bad parameter {pair!r}: expected NAME=VALUE")
        if name in values:
            raise ParameterError(f"parameter {name!r} is given more than once")
        if name not in declared:
            unknown.append(name)
            values[name] = raw
            continue
        values[name] = coerce_parameter(declared[name], raw)
    if unknown:
        known = ", ".join(sorted(declared)) or "(none)"
        raise ParameterError(
            f"unknown pipeline parameter(s): {', '.join(sorted(unknown))}; "
            f"the pipeline declares: {known}"
        )
    if check_required:
        missing = sorted(n for n, d in declared.items() if d.required and n not in values)
        if missing:
            raise ParameterError(f"missing required pipeline parameter(s): {', '.join(missing)}")
    return values


def _git(args: Sequence[str], cwd: Path) -> str:
    """Run ``git ARGS`` in `cwd` and return its stripped stdout."""
    result = subprocess.run(
        ["git", *args], cwd=cwd, capture_output=True, text=True, check=False, timeout=30
    )
    if result.returncode != 0:
        raise OpsError(
            f"git {' '.join(args)} failed in {cwd}: {result.stderr.strip() or result.returncode}"
            "; pass --version-name to name the version yourself"
        )
    return result.stdout.strip()


def git_version_name(repo: str | Path | None = None, package_version: str = __version__) -> str:
    """Return ``<package version>-g<short commit>[-dirty]``, e.g. ``0.1.0-g1a2b3c4``.

    ``-dirty`` is added when tracked files have uncommitted changes (as ``git describe
    --dirty`` does; untracked files do not count).
    """
    cwd = Path(repo) if repo is not None else PROJECT_ROOT
    try:
        commit = _git(["rev-parse", "--short=7", "HEAD"], cwd)
        dirty = bool(_git(["status", "--porcelain", "--untracked-files=no"], cwd))
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise OpsError(
            f"cannot run git in {cwd} ({exc}); pass --version-name to name the version yourself"
        ) from exc
    return f"{package_version}-g{commit}" + ("-dirty" if dirty else "")


# --------------------------------------------------------------------------------------------
# Pipelines and versions
# --------------------------------------------------------------------------------------------


def _named(
    what: str, lister: Callable[..., Any], field: str, name: str, **kwargs: Any
) -> list[Any]:
    """Every object `lister` pages through (under `field`) whose display name is `name`.

    The server is asked to filter by name; its answer is still checked for exact matches.
    """
    found = _pages(
        lambda token: _call(
            f"look up {what}",
            lister,
            page_token=token,
            page_size=_PAGE_SIZE,
            filter=_equals_filter("display_name", name),
            **kwargs,
        ),
        field,
    )
    return [item for item in found if item.display_name == name]


def find_pipeline(client: kfp.Client, name: str, namespace: str | None = None) -> Any | None:
    """Return the pipeline whose display name is `name`, or ``None``; error if several."""
    found = _named(
        f"pipeline {name!r}", client.list_pipelines, "pipelines", name, namespace=namespace
    )
    if len(found) > 1:
        ids = ", ".join(p.pipeline_id for p in found)
        raise OpsError(f"several pipelines are named {name!r} ({ids}); names must be unique")
    return found[0] if found else None


def find_pipeline_version(client: kfp.Client, pipeline_id: str, version_name: str) -> Any | None:
    """Return the version of pipeline `pipeline_id` named `version_name`, or ``None``."""
    found = _named(
        f"version {version_name!r} of pipeline {pipeline_id}",
        client.list_pipeline_versions,
        "pipeline_versions",
        version_name,
        pipeline_id=pipeline_id,
    )
    return found[0] if found else None


@dataclass(frozen=True)
class UploadResult:
    """What :func:`upload` did."""

    pipeline_id: str
    version_id: str
    pipeline_name: str
    version_name: str
    created_pipeline: bool
    created_version: bool


def upload(
    client: kfp.Client,
    package_path: str | Path,
    version_name: str,
    *,
    pipeline_name: str | None = None,
    description: str | None = None,
    namespace: str | None = None,
    reuse_existing: bool = False,
) -> UploadResult:
    """Upload `package_path` as version `version_name` of its pipeline, creating the pipeline.

    The pipeline (named `pipeline_name`, default: the package's ``pipelineInfo.name``) is
    created empty when missing (``POST /apis/v2beta1/pipelines``) so that every version,
    the first one included, carries `version_name`; the package is then uploaded with
    ``POST /apis/v2beta1/pipelines/upload_version``. A version of that name existing already
    is an error, unless `reuse_existing`, which returns it untouched (for re-run CI jobs).
    `namespace` makes the pipeline private to that namespace (multi-user KFP).
    """
    spec = read_pipeline_spec(package_path)
    name = pipeline_name or pipeline_name_of(spec)
    if not version_name or not version_name.strip():
        raise OpsError("the version name is empty")
    pipeline = find_pipeline(client, name, namespace)
    created_pipeline = False
    if pipeline is None:
        body = kfp_server_api.V2beta1Pipeline(
            display_name=name, description=description, namespace=namespace
        )
        pipeline = _call(
            f"create pipeline {name!r}", client.pipelines.pipeline_service_create_pipeline, body
        )
        created_pipeline = True
    else:
        existing = find_pipeline_version(client, pipeline.pipeline_id, version_name)
        if existing is not None:
            if reuse_existing:
                return UploadResult(
                    pipeline.pipeline_id,
                    existing.pipeline_version_id,
                    name,
                    version_name,
                    created_pipeline=False,
                    created_version=False,
                )
            raise AlreadyExistsError(
                f"pipeline {name!r} already has a version named {version_name!r} "
                f"({existing.pipeline_version_id}); commit your change, pass another "
                "--version-name, or --reuse-existing to keep the existing one"
            )
    try:
        version = _call(
            f"upload version {version_name!r} of pipeline {name!r}",
            client.upload_pipeline_version,
            pipeline_package_path=str(package_path),
            pipeline_version_name=version_name,
            pipeline_id=pipeline.pipeline_id,
            description=description,
        )
    except AlreadyExistsError as exc:  # created by someone else between the check and now
        raise AlreadyExistsError(
            f"pipeline {name!r} already has a version named {version_name!r}: {exc}"
        ) from exc
    return UploadResult(
        pipeline.pipeline_id,
        version.pipeline_version_id,
        name,
        version_name,
        created_pipeline=created_pipeline,
        created_version=True,
    )


def resolve_version(
    client: kfp.Client, pipeline_name: str, version_name: str, namespace: str | None = None
) -> tuple[Any, Any]:
    """Return ``(pipeline, version)`` for the named version, fetched with its pipeline spec."""
    pipeline = find_pipeline(client, pipeline_name, namespace)
    if pipeline is None:
        raise NotFoundError(
            f"no pipeline named {pipeline_name!r} on the server; upload it first "
            "(python -m pipeline upload)"
        )
    version = find_pipeline_version(client, pipeline.pipeline_id, version_name)
    if version is None:
        raise NotFoundError(f"pipeline {pipeline_name!r} has no version named {version_name!r}")
    if not version.pipeline_spec:  # list responses may omit the spec; GET has it
        version = _call(
            f"get version {version_name!r} of pipeline {pipeline_name!r}",
            client.get_pipeline_version,
            pipeline_id=pipeline.pipeline_id,
            pipeline_version_id=version.pipeline_version_id,
        )
    return pipeline, version


# --------------------------------------------------------------------------------------------
# Runs
# --------------------------------------------------------------------------------------------


def get_or_create_experiment(client: kfp.Client, name: str, namespace: str | None = None) -> str:
    """Return the id of experiment `name`, creating it when missing."""
    found = _named(
        f"experiment {name!r}", client.list_experiments, "experiments", name, namespace=namespace
    )
    if found:
        return str(found[0].experiment_id)
    body = kfp_server_api.V2beta1Experiment(display_name=name, namespace=namespace)
    created = _call(
        f"create experiment {name!r}",
        client.experiments.experiment_service_create_experiment,
        body,
    )
    return str(created.experiment_id)


def default_run_name(pipeline_name: str, version_name: str | None = None) -> str:
    """Return ``<pipeline> <version> <UTC time>``, the run name when none is given."""
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    return " ".join(part for part in (pipeline_name, version_name, stamp) if part)


def submit_run(
    client: kfp.Client,
    *,
    run_name: str,
    experiment_id: str,
    params: Mapping[str, Any],
    package_path: str | Path | None = None,
    pipeline_id: str | None = None,
    version_id: str | None = None,
    pipeline_root: str | None = None,
    service_account: str | None = None,
    enable_caching: bool | None = None,
) -> Any:
    """Create a run from a compiled package or from an uploaded version; return the run.

    Give exactly one of `package_path` or (`pipeline_id`, `version_id`).
    """
    from_package = package_path is not None
    from_version = pipeline_id is not None or version_id is not None
    if from_package == from_version or (from_version and not (pipeline_id and version_id)):
        raise OpsError("give either a package path or both a pipeline id and a version id")
    return _call(
        f"create run {run_name!r}",
        client.run_pipeline,
        experiment_id=experiment_id,
        job_name=run_name,
        pipeline_package_path=str(package_path) if package_path is not None else None,
        params=dict(params),
        pipeline_id=pipeline_id,
        version_id=version_id,
        pipeline_root=pipeline_root,
        enable_caching=enable_caching,
        service_account=service_account,
    )


def _state(run: Any) -> str:
    """Return the run's state as an upper-case string ("RUNTIME_STATE_UNSPECIFIED" if none)."""
    return str(run.state or "RUNTIME_STATE_UNSPECIFIED").upper()


def failed_tasks(run: Any) -> list[str]:
    """Return ``name: error`` for each failed task of `run`, innermost tasks first.

    DAG tasks (those with child tasks) fail when a child fails; they are only listed when no
    leaf task is reported failed.
    """
    details = getattr(run.run_details, "task_details", None) if run.run_details else None
    failed = [t for t in details or [] if str(t.state or "").upper() == "FAILED"]
    leaves = [t for t in failed if not t.child_tasks] or failed
    described = []
    for task in leaves:
        label = task.display_name or task.task_id or "(unnamed task)"
        message = getattr(task.error, "message", None) if task.error else None
        described.append(f"{label}: {message}" if message else label)
    return described


def wait_for_run(
    client: kfp.Client,
    run_id: str,
    timeout: float,
    *,
    poll_interval: float = 10.0,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
    on_state: Callable[[str], None] | None = None,
) -> Any:
    """Poll run `run_id` until it finishes; return it if it SUCCEEDED.

    Raises :class:`RunFailedError` (naming the failed tasks) if it ends FAILED, CANCELED or
    SKIPPED, and :class:`RunTimeoutError` if it is still going after `timeout` seconds.
    Up to :data:`MAX_CONSECUTIVE_POLL_ERRORS` consecutive HTTP 5xx or network errors are
    retried; a 404 or any other error ends the wait at once. `on_state` is called with each
    new state.
    """
    if timeout <= 0:
        raise OpsError(f"the wait timeout must be positive, got {timeout}")
    deadline = clock() + timeout
    errors = 0
    last_state = "UNKNOWN"
    while True:
        try:
            run = _call(f"get run {run_id}", client.get_run, run_id=run_id)
            errors = 0
        except OpsError as exc:
            errors += 1
            if not exc.transient or errors > MAX_CONSECUTIVE_POLL_ERRORS:
                raise
            run = None
        if run is not None:
            state = _state(run)
            if state != last_state and on_state is not None:
                on_state(state)
            last_state = state
            if state in TERMINAL_STATES:
                if state in SUCCESS_STATES:
                    return run
                tasks = failed_tasks(run)
                run_error = getattr(run.error, "message", None) if run.error else None
                reason = (
                    "failed task(s): " + "; ".join(tasks)
                    if tasks
                    else (run_error or "no failed task reported")
                )
                raise RunFailedError(f"run {run_id} ended {state}: {reason}", run_id, state, tasks)
        if clock() >= deadline:
            raise RunTimeoutError(
                f"run {run_id} did not finish within {timeout:g} s (last state: {last_state}); "
                "it is still running on the cluster",
                run_id,
                last_state,
            )
        sleep(max(0.0, min(poll_interval, deadline - clock())))


# --------------------------------------------------------------------------------------------
# Schedules (recurring runs)
# --------------------------------------------------------------------------------------------

_MONTHS = ("JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC")
_WEEKDAYS = ("SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT")
_CRON_FIELDS: tuple[tuple[str, int, int, dict[str, int]], ...] = (
    ("second", 0, 59, {}),
    ("minute", 0, 59, {}),
    ("hour", 0, 23, {}),
    ("day of month", 1, 31, {}),
    (
        "month",
        1,
        12,
        {m: i + 1 for i, m in enumerate(_MONTHS)},
    ),
    ("day of week", 0, 6, {d: i for i, d in enumerate(_WEEKDAYS)}),
)


def _cron_value(field: str, text: str, low: int, high: int, names: Mapping[str, int]) -> int:
    """Return the number `text` stands for in cron field `field`, checked against its range."""
    upper = text.upper()
    if upper in names:
        return names[upper]
    if not text.isdigit():
        raise CronError(f"cron {field} field: {text!r} is not a number")
    value = int(text)
    if not low <= value <= high:
        raise CronError(f"cron {field} field: {value} is out of range {low}-{high}")
    return value


def _check_cron_field(field: str, text: str, low: int, high: int, names: Mapping[str, int]) -> None:
    """Check one cron field: ``*``, ``?``, ``a``, ``a-b``, ``*/n``, ``a/n``, ``a-b/n`` lists."""
    for part in text.split(","):
        if not part:
            raise CronError(f"cron {field} field {text!r} has an empty list item")
        span, slash, step = part.partition("/")
        if slash and (not step.isdigit() or int(step) == 0):
            raise CronError(f"cron {field} field: step {step!r} must be a positive number")
        if span in ("*", "?"):
            if span == "?" and field not in ("day of month", "day of week"):
                raise CronError(f"cron {field} field: '?' is only allowed in the day fields")
            continue
        first, dash, last = span.partition("-")
        start = _cron_value(field, first, low, high, names)
        if dash:
            end = _cron_value(field, last, low, high, names)
            if end < start:
                raise CronError(f"cron {field} field: range {span!r} runs backwards")


def validate_cron(expression: str) -> str:
    """Return `expression` normalised if it is a valid KFP cron expression, else raise.

    KFP (robfig/cron with seconds) takes 6 fields: ``SECOND MINUTE HOUR DAY-OF-MONTH MONTH
    DAY-OF-WEEK``, e.g. ``0 0 2 * * *`` for 02:00 every day. Each field takes ``*``, ``?``
    (day fields only), numbers, month/day names, ranges ``a-b``, steps ``/n`` and lists ``,``.
    """
    fields = expression.split()
    if len(fields) != 6:
        hint = ""
        if len(fields) == 5:
            hint = f"; KFP cron has a leading seconds field, did you mean '0 {' '.join(fields)}'?"
        raise CronError(
            f"cron expression {expression!r} has {len(fields)} fields, KFP needs 6: "
            f"SECOND MINUTE HOUR DAY-OF-MONTH MONTH DAY-OF-WEEK{hint}"
        )
    for text, (field, low, high, names) in zip(fields, _CRON_FIELDS, strict=True):
        _check_cron_field(field, text, low, high, names)
    return " ".join(fields)


def find_schedules(
    client: kfp.Client, name: str | None = None, namespace: str | None = None
) -> list[Any]:
    """Return the recurring runs (all, or those whose display name is `name`)."""

    def fetch(token: str) -> Any:
        kwargs: dict[str, Any] = {"page_token": token, "page_size": _PAGE_SIZE}
        if name is not None:
            kwargs["filter"] = _equals_filter("display_name", name)
        if namespace is not None:
            kwargs["namespace"] = namespace
        return _call("list schedules", client.list_recurring_runs, **kwargs)

    found = list(_pages(fetch, "recurring_runs"))
    return [r for r in found if name is None or r.display_name == name]


def resolve_schedule(client: kfp.Client, ref: str, namespace: str | None = None) -> Any:
    """Return the recurring run named `ref`, or else the one whose id is `ref`."""
    named = find_schedules(client, ref, namespace)
    if len(named) > 1:
        ids = ", ".join(r.recurring_run_id for r in named)
        raise OpsError(f"several schedules are named {ref!r} ({ids}); give the id instead")
    if named:
        return named[0]
    try:
        return _call(f"get schedule {ref}", client.get_recurring_run, recurring_run_id=ref)
    except NotFoundError as exc:
        raise NotFoundError(f"no schedule named or with id {ref!r}") from exc


def create_schedule(
    client: kfp.Client,
    *,
    name: str,
    cron: str,
    pipeline_id: str,
    version_id: str,
    experiment_id: str,
    params: Mapping[str, Any],
    max_concurrency: int = 1,
    no_catchup: bool = True,
    enabled: bool = True,
    namespace: str | None = None,
    description: str | None = None,
    service_account: str | None = None,
) -> Any:
    """Create a recurring run of an uploaded pipeline version; the name must be unused."""
    expression = validate_cron(cron)
    if not 1 <= max_concurrency <= MAX_CONCURRENCY_LIMIT:
        raise OpsError(
            f"max_concurrency must be between 1 and {MAX_CONCURRENCY_LIMIT}, got {max_concurrency}"
        )
    if find_schedules(client, name, namespace):
        raise AlreadyExistsError(
            f"a schedule named {name!r} exists already; delete it first or pick another --name"
        )
    return _call(
        f"create schedule {name!r}",
        client.create_recurring_run,
        experiment_id=experiment_id,
        job_name=name,
        description=description,
        cron_expression=expression,
        max_concurrency=max_concurrency,
        no_catchup=no_catchup,
        params=dict(params),
        pipeline_id=pipeline_id,
        version_id=version_id,
        enabled=enabled,
        service_account=service_account,
    )


def pause_schedule(client: kfp.Client, recurring_run_id: str) -> None:
    """Disable a recurring run (no new runs start; running ones go on)."""
    _call(
        f"pause schedule {recurring_run_id}",
        client.disable_recurring_run,
        recurring_run_id=recurring_run_id,
    )


def resume_schedule(client: kfp.Client, recurring_run_id: str) -> None:
    """Enable a paused recurring run again."""
    _call(
        f"resume schedule {recurring_run_id}",
        client.enable_recurring_run,
        recurring_run_id=recurring_run_id,
    )


def delete_schedule(client: kfp.Client, recurring_run_id: str) -> None:
    """Delete a recurring run (runs it started are kept)."""
    _call(
        f"delete schedule {recurring_run_id}",
        client.delete_recurring_run,
        recurring_run_id=recurring_run_id,
    )
