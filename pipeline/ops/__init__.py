"""Operating the pipeline on a Kubeflow Pipelines (v2) cluster: upload, submit, wait, schedule.

Plain functions over a real ``kfp.Client``; ``pipeline/ops_cli.py`` is the thin click layer.
Every failure is raised as :class:`OpsError` (or a subclass) with a message that names what
was wrong: the parameter, the pipeline, the version, the run's failed task, the HTTP status.

One module per concern, all re-exported here (``from pipeline import ops; ops.upload(...)``):

- :mod:`~pipeline.ops.connection`: endpoint, namespace, credentials, health check, timeouts;
- :mod:`~pipeline.ops.pipelines`: the compiled package, git-named versions, upload, look-up;
- :mod:`~pipeline.ops.parameters`: declared pipeline inputs and typed ``NAME=VALUE`` values;
- :mod:`~pipeline.ops.runs`: experiments, submitting a run, waiting for it;
- :mod:`~pipeline.ops.schedules`: recurring runs and their cron check;
- :mod:`~pipeline.ops.api` and :mod:`~pipeline.ops.errors`: the call wrapper and the errors.

Nothing here reads the environment at import time.
"""

from pipeline.ops.connection import (
    DEFAULT_REQUEST_TIMEOUT_S,
    KfpSettings,
    check_health,
    connect,
    normalize_host,
)
from pipeline.ops.errors import (
    AlreadyExistsError,
    CronError,
    NotFoundError,
    OpsError,
    ParameterError,
    RunFailedError,
    RunTimeoutError,
)
from pipeline.ops.parameters import (
    ParameterDecl,
    coerce_parameter,
    declared_parameters,
    parse_parameters,
)
from pipeline.ops.pipelines import (
    DEFAULT_PACKAGE,
    DEFAULT_PIPELINE_NAME,
    PROJECT_ROOT,
    UploadResult,
    find_pipeline,
    find_pipeline_version,
    git_version_name,
    pipeline_name_of,
    read_pipeline_spec,
    resolve_version,
    upload,
)
from pipeline.ops.runs import (
    DEFAULT_EXPERIMENT,
    MAX_CONSECUTIVE_POLL_ERRORS,
    SUCCESS_STATES,
    TERMINAL_STATES,
    default_run_name,
    failed_tasks,
    get_or_create_experiment,
    submit_run,
    wait_for_run,
)
from pipeline.ops.schedules import (
    MAX_CONCURRENCY_LIMIT,
    create_schedule,
    delete_schedule,
    find_schedules,
    pause_schedule,
    resolve_schedule,
    resume_schedule,
    validate_cron,
)

__all__ = [
    "DEFAULT_EXPERIMENT",
    "DEFAULT_PACKAGE",
    "DEFAULT_PIPELINE_NAME",
    "DEFAULT_REQUEST_TIMEOUT_S",
    "MAX_CONCURRENCY_LIMIT",
    "MAX_CONSECUTIVE_POLL_ERRORS",
    "PROJECT_ROOT",
    "SUCCESS_STATES",
    "TERMINAL_STATES",
    "AlreadyExistsError",
    "CronError",
    "KfpSettings",
    "NotFoundError",
    "OpsError",
    "ParameterDecl",
    "ParameterError",
    "RunFailedError",
    "RunTimeoutError",
    "UploadResult",
    "check_health",
    "coerce_parameter",
    "connect",
    "create_schedule",
    "declared_parameters",
    "default_run_name",
    "delete_schedule",
    "failed_tasks",
    "find_pipeline",
    "find_pipeline_version",
    "find_schedules",
    "get_or_create_experiment",
    "git_version_name",
    "normalize_host",
    "parse_parameters",
    "pause_schedule",
    "pipeline_name_of",
    "read_pipeline_spec",
    "resolve_schedule",
    "resolve_version",
    "resume_schedule",
    "submit_run",
    "upload",
    "validate_cron",
    "wait_for_run",
]
