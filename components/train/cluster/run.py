"""One cluster job from start to checked end: `run_job`, which both backends' entry points
(`run_mpijob`, `run_trainjob`) call with their `Backend` and manifest, and `check_run`."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterator
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from components.common import storage
from components.train import summary
from components.train.cluster.discovery import check_api
from components.train.cluster.lifecycle import (
    DEADLINE_GRACE_S,
    Backend,
    JobCancelled,
    Log,
    RunCheckError,
    create_or_reattach,
    default_api_client,
    delete_job,
    follow,
)
from components.train.cluster.params import ClusterJobParams, owner_reference
from components.train.summary import RunSummary


class _Terminated(BaseException):
    """Raised from the SIGTERM handler; a BaseException so no `except Exception` swallows it."""


def check_run(params: ClusterJobParams, kind: str, log: Log = print) -> RunSummary:
    """Check the finished run's outputs; return its run summary.

    The summary and the SavedModel must exist at the expected URIs, and the Horovod world size
    must equal workers x slots per worker.
    """
    train = params.train
    try:
        record = summary.read(train.summary_uri)
    except ValueError as exc:
        raise RunCheckError(f"the {kind} succeeded but its {exc}") from exc
    if record.model_uri.rstrip("/") != train.model_uri.rstrip("/"):
        raise RunCheckError(
            f"run summary {train.summary_uri} names model_uri {record.model_uri!r}, "
            f"expected {train.model_uri!r}"
        )
    saved_model = storage.join(train.model_uri, "saved_model.pb")
    if not storage.exists(saved_model):
        raise RunCheckError(f"the {kind} succeeded but there is no model at {saved_model}")
    for key, value in (("world_size", record.world_size), ("workers", record.config.world_size)):
        if value != train.world_size:
            raise RunCheckError(
                f"run summary {train.summary_uri} has {key}={value!r}, expected "
                f"workers x slots = {train.workers} x {train.slots_per_worker} = "
                f"{train.world_size}"
            )
    log(
        f"run summary at {train.summary_uri}: world_size {record.world_size}, "
        f"model {train.model_uri}"
    )
    return record


def add_owner(
    core: client.CoreV1Api, params: ClusterJobParams, manifest: dict[str, Any], log: Log
) -> None:
    """Make the task's pod the job's owner when only the pod's name is known (reads its uid)."""
    if not params.owner_pod_name or params.owner_pod_uid:
        return  # no owner, or the manifest already has it
    namespace = manifest["metadata"]["namespace"]
    try:
        pod = core.read_namespaced_pod(params.owner_pod_name, namespace)
    except ApiException as exc:
        log(
            f"WARNING: cannot read owner pod {params.owner_pod_name} ({exc.status}); "
            "no owner reference"
        )
        return
    manifest["metadata"]["ownerReferences"] = [
        owner_reference(params.owner_pod_name, pod.metadata.uid)
    ]


@contextlib.contextmanager
def _sigterm_raises() -> Iterator[None]:
    """Within the block, SIGTERM raises `_Terminated` (only the main thread can set handlers)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: Any) -> None:
        raise _Terminated()

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def run_job(
    backend: Backend,
    params: ClusterJobParams,
    manifest: dict[str, Any],
    *,
    api_client: client.ApiClient | None = None,
    prepare: Callable[[client.ApiClient], None] | None = None,
    poll_interval_s: float = 5.0,
    log: Log = print,
    cleanup_timeout_s: float = 60.0,
    deadline_grace_s: float = DEADLINE_GRACE_S,
) -> RunSummary:
    """Run the validated job `manifest` (with its namespace) and return its checked summary.

    The cluster must serve the job's API; `prepare` then runs (the TrainJob's runtime is made
    there), and the job is created or reattached to, followed, and its outputs checked.
    Raises `JobFailed` if the job fails, `JobCancelled` on SIGTERM (after deleting the job),
    and `RunCheckError` if it succeeded without the expected outputs.
    """
    namespace, name = manifest["metadata"]["namespace"], manifest["metadata"]["name"]
    what = backend.what(namespace, name)
    api_client = api_client or default_api_client()
    custom, core = client.CustomObjectsApi(api_client), client.CoreV1Api(api_client)
    check_api(custom, backend.crd, backend.install)
    with _sigterm_raises():
        try:
            if prepare is not None:
                prepare(api_client)
            add_owner(core, params, manifest, log)
            create_or_reattach(
                custom, backend, manifest, log=log, cleanup_timeout_s=cleanup_timeout_s
            )
            follow(
                custom, core, backend, namespace, name,
                deadline_s=params.active_deadline_seconds + deadline_grace_s,
                poll_interval_s=poll_interval_s, log=log,
            )  # fmt: skip
        except (_Terminated, KeyboardInterrupt) as exc:
            log(f"task cancelled: deleting {what}")
            left = delete_job(
                custom, core, backend, namespace, name, log=log, timeout_s=cleanup_timeout_s
            )
            suffix = f"; pods still present: {', '.join(left)}" if left else ""
            raise JobCancelled(f"cancelled; {what} deleted{suffix}") from exc
    return check_run(params, backend.crd.kind, log)
