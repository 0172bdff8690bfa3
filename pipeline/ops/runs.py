"""Runs: the experiment they are filed under, submitting one, and waiting for it to finish.

Submitting goes through kfp.Client's ``run_pipeline``. Two of its helpers are not used, for
reasons a test would notice:

- ``create_experiment`` (get or create) prints an "Experiment details" link to stdout and
  treats any lookup error other than "not found" as fatal without the HTTP status;
- ``wait_for_run_completion`` does not count CANCELED as finished (it would wait until the
  timeout), gives up on the first HTTP 5xx, and reports neither the state nor the failed task.
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import kfp
import kfp_server_api

from pipeline.ops.api import call, named
from pipeline.ops.errors import OpsError, RunFailedError, RunTimeoutError

# Run states (kfp_server_api.V2beta1RuntimeState) after which a run will not change any more.
TERMINAL_STATES = frozenset({"SUCCEEDED", "FAILED", "SKIPPED", "CANCELED"})
SUCCESS_STATES = frozenset({"SUCCEEDED"})
# How many consecutive transient errors (HTTP 5xx, network) `wait_for_run` tolerates.
MAX_CONSECUTIVE_POLL_ERRORS = 3


def get_or_create_experiment(client: kfp.Client, name: str, namespace: str | None = None) -> str:
    """Return the id of experiment `name`, creating it when missing."""
    found = named(
        f"experiment {name!r}", client.list_experiments, "experiments", name, namespace=namespace
    )
    if found:
        return str(found[0].experiment_id)
    body = kfp_server_api.V2beta1Experiment(display_name=name, namespace=namespace)
    created = call(
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
    return call(
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


def _raise_unless_succeeded(run: Any, run_id: str, state: str) -> None:
    """Raise :class:`RunFailedError` for a run that finished in `state` other than SUCCEEDED."""
    if state in SUCCESS_STATES:
        return
    tasks = failed_tasks(run)
    run_error = getattr(run.error, "message", None) if run.error else None
    reason = (
        "failed task(s): " + "; ".join(tasks) if tasks else (run_error or "no failed task reported")
    )
    raise RunFailedError(f"run {run_id} ended {state}: {reason}", run_id, state, tasks)


class _Poller:
    """GETs one run, tolerating up to MAX_CONSECUTIVE_POLL_ERRORS transient errors in a row."""

    def __init__(self, client: kfp.Client, run_id: str) -> None:
        self.client = client
        self.run_id = run_id
        self.errors = 0

    def get(self) -> Any | None:
        """Return the run, or ``None`` after a transient error that may be retried."""
        try:
            run = call(f"get run {self.run_id}", self.client.get_run, run_id=self.run_id)
        except OpsError as exc:
            self.errors += 1
            if not exc.transient or self.errors > MAX_CONSECUTIVE_POLL_ERRORS:
                raise
            return None
        self.errors = 0
        return run


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
    poller = _Poller(client, run_id)
    last_state = "UNKNOWN"
    while True:
        run = poller.get()
        if run is not None:
            state = _state(run)
            if state != last_state and on_state is not None:
                on_state(state)
            last_state = state
            if state in TERMINAL_STATES:
                _raise_unless_succeeded(run, run_id, state)
                return run
        if clock() >= deadline:
            raise RunTimeoutError(
                f"run {run_id} did not finish within {timeout:g} s (last state: {last_state}); "
                "it is still running on the cluster",
                run_id,
                last_state,
            )
        sleep(max(0.0, min(poll_interval, deadline - clock())))
