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

Nothing here reads the environment at import time, and nothing is imported until used: the
submodules import ``kfp`` (which imports ``kubernetes``), and ``python -m pipeline --help``
should not pay for that.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pipeline.ops.connection import (
        KfpSettings as KfpSettings,
    )
    from pipeline.ops.connection import (
        check_health as check_health,
    )
    from pipeline.ops.connection import (
        connect as connect,
    )
    from pipeline.ops.connection import (
        normalize_host as normalize_host,
    )
    from pipeline.ops.errors import (
        AlreadyExistsError as AlreadyExistsError,
    )
    from pipeline.ops.errors import (
        CronError as CronError,
    )
    from pipeline.ops.errors import (
        NotFoundError as NotFoundError,
    )
    from pipeline.ops.errors import (
        OpsError as OpsError,
    )
    from pipeline.ops.errors import (
        ParameterError as ParameterError,
    )
    from pipeline.ops.errors import (
        RunFailedError as RunFailedError,
    )
    from pipeline.ops.errors import (
        RunTimeoutError as RunTimeoutError,
    )
    from pipeline.ops.parameters import (
        ParameterDecl as ParameterDecl,
    )
    from pipeline.ops.parameters import (
        coerce_parameter as coerce_parameter,
    )
    from pipeline.ops.parameters import (
        declared_parameters as declared_parameters,
    )
    from pipeline.ops.parameters import (
        parse_parameters as parse_parameters,
    )
    from pipeline.ops.pipelines import (
        PROJECT_ROOT as PROJECT_ROOT,
    )
    from pipeline.ops.pipelines import (
        UploadResult as UploadResult,
    )
    from pipeline.ops.pipelines import (
        find_pipeline as find_pipeline,
    )
    from pipeline.ops.pipelines import (
        find_pipeline_version as find_pipeline_version,
    )
    from pipeline.ops.pipelines import (
        git_version_name as git_version_name,
    )
    from pipeline.ops.pipelines import (
        pipeline_name_of as pipeline_name_of,
    )
    from pipeline.ops.pipelines import (
        read_pipeline_spec as read_pipeline_spec,
    )
    from pipeline.ops.pipelines import (
        resolve_version as resolve_version,
    )
    from pipeline.ops.pipelines import (
        upload as upload,
    )
    from pipeline.ops.runs import (
        MAX_CONSECUTIVE_POLL_ERRORS as MAX_CONSECUTIVE_POLL_ERRORS,
    )
    from pipeline.ops.runs import (
        SUCCESS_STATES as SUCCESS_STATES,
    )
    from pipeline.ops.runs import (
        TERMINAL_STATES as TERMINAL_STATES,
    )
    from pipeline.ops.runs import (
        default_run_name as default_run_name,
    )
    from pipeline.ops.runs import (
        failed_tasks as failed_tasks,
    )
    from pipeline.ops.runs import (
        get_or_create_experiment as get_or_create_experiment,
    )
    from pipeline.ops.runs import (
        submit_run as submit_run,
    )
    from pipeline.ops.runs import (
        wait_for_run as wait_for_run,
    )
    from pipeline.ops.schedules import (
        create_schedule as create_schedule,
    )
    from pipeline.ops.schedules import (
        delete_schedule as delete_schedule,
    )
    from pipeline.ops.schedules import (
        find_schedules as find_schedules,
    )
    from pipeline.ops.schedules import (
        pause_schedule as pause_schedule,
    )
    from pipeline.ops.schedules import (
        resolve_schedule as resolve_schedule,
    )
    from pipeline.ops.schedules import (
        resume_schedule as resume_schedule,
    )
    from pipeline.ops.schedules import (
        validate_cron as validate_cron,
    )
    from pipeline.ops.settings import (
        DEFAULT_EXPERIMENT as DEFAULT_EXPERIMENT,
    )
    from pipeline.ops.settings import (
        DEFAULT_PACKAGE as DEFAULT_PACKAGE,
    )
    from pipeline.ops.settings import (
        DEFAULT_PIPELINE_NAME as DEFAULT_PIPELINE_NAME,
    )
    from pipeline.ops.settings import (
        DEFAULT_REQUEST_TIMEOUT_S as DEFAULT_REQUEST_TIMEOUT_S,
    )
    from pipeline.ops.settings import (
        MAX_CONCURRENCY_LIMIT as MAX_CONCURRENCY_LIMIT,
    )

# name -> the submodule that defines it
_WHERE: dict[str, str] = {
    "DEFAULT_REQUEST_TIMEOUT_S": "pipeline.ops.settings",
    "KfpSettings": "pipeline.ops.connection",
    "check_health": "pipeline.ops.connection",
    "connect": "pipeline.ops.connection",
    "normalize_host": "pipeline.ops.connection",
    "AlreadyExistsError": "pipeline.ops.errors",
    "CronError": "pipeline.ops.errors",
    "NotFoundError": "pipeline.ops.errors",
    "OpsError": "pipeline.ops.errors",
    "ParameterError": "pipeline.ops.errors",
    "RunFailedError": "pipeline.ops.errors",
    "RunTimeoutError": "pipeline.ops.errors",
    "ParameterDecl": "pipeline.ops.parameters",
    "coerce_parameter": "pipeline.ops.parameters",
    "declared_parameters": "pipeline.ops.parameters",
    "parse_parameters": "pipeline.ops.parameters",
    "DEFAULT_PACKAGE": "pipeline.ops.settings",
    "DEFAULT_PIPELINE_NAME": "pipeline.ops.settings",
    "PROJECT_ROOT": "pipeline.ops.pipelines",
    "UploadResult": "pipeline.ops.pipelines",
    "find_pipeline": "pipeline.ops.pipelines",
    "find_pipeline_version": "pipeline.ops.pipelines",
    "git_version_name": "pipeline.ops.pipelines",
    "pipeline_name_of": "pipeline.ops.pipelines",
    "read_pipeline_spec": "pipeline.ops.pipelines",
    "resolve_version": "pipeline.ops.pipelines",
    "upload": "pipeline.ops.pipelines",
    "DEFAULT_EXPERIMENT": "pipeline.ops.settings",
    "MAX_CONSECUTIVE_POLL_ERRORS": "pipeline.ops.runs",
    "SUCCESS_STATES": "pipeline.ops.runs",
    "TERMINAL_STATES": "pipeline.ops.runs",
    "default_run_name": "pipeline.ops.runs",
    "failed_tasks": "pipeline.ops.runs",
    "get_or_create_experiment": "pipeline.ops.runs",
    "submit_run": "pipeline.ops.runs",
    "wait_for_run": "pipeline.ops.runs",
    "MAX_CONCURRENCY_LIMIT": "pipeline.ops.settings",
    "create_schedule": "pipeline.ops.schedules",
    "delete_schedule": "pipeline.ops.schedules",
    "find_schedules": "pipeline.ops.schedules",
    "pause_schedule": "pipeline.ops.schedules",
    "resolve_schedule": "pipeline.ops.schedules",
    "resume_schedule": "pipeline.ops.schedules",
    "validate_cron": "pipeline.ops.schedules",
}

__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    """Import the submodule that defines `name` on first use (PEP 562)."""
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_WHERE[name]), name)
    globals()[name] = value
    return value
