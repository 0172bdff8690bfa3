"""Run one MPIJob through the official ``kubernetes`` client: create or reattach, follow, cancel.

`run_mpijob` is the train component's single entry point for the MPIJob backend:

1. validate the parameters and the manifest (nothing is sent if either is wrong);
2. create the MPIJob, or reattach to the one an earlier attempt of the same task created
   (a job that already *failed* is replaced, so a KFP retry really retries);
3. poll the job's conditions (Created, Running, Restarting, Succeeded, Failed) and copy the
   launcher pod's new log lines into the component's log;
4. on Failed (including eviction and the operator's deadline), or when the client-side deadline
   backstop passes, raise `MPIJobFailed` with the reason and the launcher log's last lines;
5. on SIGTERM (the KFP task is cancelled), delete the MPIJob with foreground propagation,
   wait for its pods to go, and raise `MPIJobCancelled`;
6. on success, check the run summary and the model at their URIs and the world size.
"""

from __future__ import annotations

import collections
import contextlib
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from components.common import storage
from components.train.mpijob.manifest import (
    ANNOTATION_RUN_ID,
    ANNOTATION_RUN_NAME,
    API_GROUP,
    API_VERSION,
    LABEL_JOB,
    LABEL_ROLE,
    PLURAL,
    MPIJobParams,
    build_manifest,
    owner_reference,
)
from components.train.mpijob.validate import validate_manifest
from components.train.summary import RunSummary, parse

Log = Callable[[str], None]

# mpi-operator's own pod labels (used as a fallback when our template labels are absent).
OPERATOR_JOB_LABEL = "training.kubeflow.org/job-name"
OPERATOR_ROLE_LABEL = "training.kubeflow.org/job-role"
LOG_TAIL_LINES = 50
DEADLINE_GRACE_S = 300.0


class MPIJobError(RuntimeError):
    """Base class of the MPIJob backend's run-time errors."""


class MPIJobFailed(MPIJobError):
    """The MPIJob failed; carries the reason and the launcher log's last lines."""

    def __init__(self, name: str, reason: str, message: str, log_tail: list[str]) -> None:
        self.name, self.reason, self.message, self.log_tail = name, reason, message, log_tail
        tail = "\n".join(log_tail) if log_tail else "(no launcher log)"
        super().__init__(
            f"MPIJob {name} failed: {reason}: {message}\n"
            f"--- last {len(log_tail)} lines of the launcher log ---\n{tail}"
        )


class MPIJobCancelled(MPIJobError):
    """The task was cancelled (SIGTERM); the MPIJob was deleted."""


class RunCheckError(MPIJobError):
    """The job succeeded but its outputs are missing or wrong; the message names which."""


class _Terminated(BaseException):
    """Raised from the SIGTERM handler; a BaseException so no `except Exception` swallows it."""


@dataclass(frozen=True)
class JobState:
    """Where the MPIJob is: the newest true condition, its reason and message."""

    phase: str  # Pending (no condition yet), Created, Running, Restarting, Suspended,
    # Succeeded or Failed
    reason: str = ""
    message: str = ""

    @property
    def finished(self) -> bool:
        """True once the job has succeeded or failed."""
        return self.phase in ("Succeeded", "Failed")


def job_state(job: dict[str, Any]) -> JobState:
    """The state of an MPIJob object from its ``status.conditions``."""
    conditions = [
        c for c in (job.get("status") or {}).get("conditions") or [] if c.get("status") == "True"
    ]
    by_type = {c.get("type"): c for c in conditions}
    for terminal in ("Failed", "Succeeded"):  # terminal conditions win over the rest
        if terminal in by_type:
            c = by_type[terminal]
            return JobState(terminal, c.get("reason", ""), c.get("message", ""))
    if not conditions:
        return JobState("Pending")
    latest = max(
        enumerate(conditions),
        key=lambda ic: (ic[1].get("lastTransitionTime") or "", ic[0]),
    )[1]
    return JobState(
        latest.get("type", "Unknown"), latest.get("reason", ""), latest.get("message", "")
    )


def default_api_client() -> client.ApiClient:
    """An API client from the in-cluster service account, else from ``~/.kube/config``."""
    from kubernetes import config

    try:
        config.load_incluster_config()
    except config.ConfigException:
        config.load_kube_config()
    return client.ApiClient()


def _get_job(api: client.CustomObjectsApi, namespace: str, name: str) -> dict[str, Any] | None:
    try:
        return dict(
            api.get_namespaced_custom_object(API_GROUP, API_VERSION, namespace, PLURAL, name)
        )
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise


def _check_same_run(existing: dict[str, Any], manifest: dict[str, Any]) -> None:
    """Refuse to adopt a job of the same name that belongs to another run."""
    want = manifest["metadata"]["annotations"]
    have = existing.get("metadata", {}).get("annotations") or {}
    for key in (ANNOTATION_RUN_ID, ANNOTATION_RUN_NAME):
        if have.get(key) != want.get(key):
            raise MPIJobError(
                f"MPIJob {manifest['metadata']['name']} exists but belongs to another run "
                f"({key}={have.get(key)!r}, expected {want.get(key)!r}); refusing to reattach"
            )


def create_or_reattach(
    api: client.CustomObjectsApi,
    namespace: str,
    manifest: dict[str, Any],
    *,
    log: Log = print,
    cleanup_timeout_s: float = 60.0,
) -> tuple[dict[str, Any], bool]:
    """Create the MPIJob, or return the existing one of the same run; ``(job, reattached)``.

    An existing job that already failed is deleted and created anew, so a retried task retries.
    """
    name = manifest["metadata"]["name"]
    for _ in range(2):
        try:
            job = api.create_namespaced_custom_object(
                API_GROUP, API_VERSION, namespace, PLURAL, manifest
            )
            log(f"created MPIJob {namespace}/{name}")
            return dict(job), False
        except ApiException as exc:
            if exc.status != 409:
                raise
        existing = _get_job(api, namespace, name)
        if existing is None:
            continue  # deleted between our create and get: create again
        _check_same_run(existing, manifest)
        state = job_state(existing)
        if state.phase != "Failed":
            log(f"reattached to MPIJob {namespace}/{name} ({state.phase}) from an earlier attempt")
            return existing, True
        log(
            f"MPIJob {namespace}/{name} from an earlier attempt failed ({state.reason}); "
            "replacing it"
        )
        delete_job(
            api, None, namespace, name, log=log, timeout_s=cleanup_timeout_s, poll_interval_s=0.5
        )
    raise MPIJobError(f"could not create MPIJob {namespace}/{name}: it keeps reappearing")


def _pods_of(core: client.CoreV1Api, namespace: str, name: str) -> list[Any]:
    """The job's pods; the label selector is also applied here in case a server ignores it."""
    pods = core.list_namespaced_pod(namespace, label_selector=f"{LABEL_JOB}={name}").items
    return [p for p in pods if (p.metadata.labels or {}).get(LABEL_JOB) == name]


def find_launcher_pod(core: client.CoreV1Api, namespace: str, name: str) -> Any | None:
    """The newest launcher pod of MPIJob `name`, or None before it exists."""
    pods = [
        p
        for p in core.list_namespaced_pod(
            namespace, label_selector=f"{LABEL_JOB}={name},{LABEL_ROLE}=launcher"
        ).items
        if (labels := p.metadata.labels or {}).get(LABEL_JOB) == name
        and labels.get(LABEL_ROLE) == "launcher"
        or labels.get(OPERATOR_JOB_LABEL) == name
        and labels.get(OPERATOR_ROLE_LABEL) == "launcher"
    ]
    if not pods:
        return None
    return max(pods, key=lambda p: (str(p.metadata.creation_timestamp or ""), p.metadata.name))


class LauncherLog:
    """Copies new lines of the launcher pod's log into `log`, and keeps the last ones.

    Each poll reads the launcher container's whole log and emits the lines past those already
    emitted; a new launcher pod (or a restarted container whose log is shorter) starts over.
    """

    def __init__(self, core: client.CoreV1Api, namespace: str, name: str, log: Log) -> None:
        self.core, self.namespace, self.name, self.log = core, namespace, name, log
        self.pod_name: str | None = None
        self.emitted = 0
        self.tail: collections.deque[str] = collections.deque(maxlen=LOG_TAIL_LINES)
        self.pod_reason = ""

    def poll(self) -> None:
        """Emit the launcher's new lines (no-op until its container has started)."""
        pod = find_launcher_pod(self.core, self.namespace, self.name)
        if pod is None:
            return
        self.pod_reason = (pod.status.reason or "") if pod.status else ""
        if pod.metadata.name != self.pod_name:
            if self.pod_name is not None:
                self.log(f"--- new launcher pod {pod.metadata.name} ---")
            self.pod_name, self.emitted = pod.metadata.name, 0
        try:
            text = self.core.read_namespaced_pod_log(
                pod.metadata.name, self.namespace, container="launcher"
            )
        except ApiException as exc:
            if exc.status in (400, 404):  # container not started yet, or pod gone
                return
            raise
        lines = str(text or "").splitlines()
        if len(lines) < self.emitted:
            self.log("--- launcher container restarted ---")
            self.emitted = 0
        for line in lines[self.emitted :]:
            self.log(line)
            self.tail.append(line)
        self.emitted = len(lines)


def follow(
    api: client.CustomObjectsApi,
    core: client.CoreV1Api,
    namespace: str,
    name: str,
    *,
    deadline_s: float | None,
    poll_interval_s: float = 5.0,
    log: Log = print,
) -> dict[str, Any]:
    """Poll the job until it succeeds (return it) or fails (raise `MPIJobFailed`).

    `deadline_s` is a client-side backstop on top of the operator's activeDeadlineSeconds:
    if it passes with the job still unfinished, the job is deleted and the task fails.
    """
    launcher = LauncherLog(core, namespace, name, log)
    start = time.monotonic()
    last_phase = ""
    while True:
        job = _get_job(api, namespace, name)
        launcher.poll()
        if job is None:
            raise MPIJobFailed(
                name, "Deleted", "the MPIJob was deleted while running", list(launcher.tail)
            )
        state = job_state(job)
        if state.phase != last_phase:
            detail = f" ({state.reason}: {state.message})" if state.reason or state.message else ""
            log(f"MPIJob {namespace}/{name}: {state.phase}{detail}")
            last_phase = state.phase
        if state.phase == "Succeeded":
            return job
        if state.phase == "Failed":
            reason = state.reason or "Failed"
            if launcher.pod_reason == "Evicted" and "Evict" not in reason:
                reason = f"{reason} (launcher pod Evicted)"
            raise MPIJobFailed(name, reason, state.message, list(launcher.tail))
        if deadline_s is not None and time.monotonic() - start > deadline_s:
            delete_job(api, core, namespace, name, log=log)
            raise MPIJobFailed(
                name,
                "DeadlineExceeded",
                f"still {state.phase} after {deadline_s:.0f}s; the MPIJob was deleted",
                list(launcher.tail),
            )
        time.sleep(poll_interval_s)


def delete_job(
    api: client.CustomObjectsApi,
    core: client.CoreV1Api | None,
    namespace: str,
    name: str,
    *,
    log: Log = print,
    timeout_s: float = 60.0,
    poll_interval_s: float = 1.0,
) -> list[str]:
    """Delete the MPIJob (foreground: its pods go first) and wait for it and its pods to go.

    Returns the names of pods still present after `timeout_s` (empty when clean); with
    `core` None only the job itself is waited for.
    """
    try:
        api.delete_namespaced_custom_object(
            API_GROUP,
            API_VERSION,
            namespace,
            PLURAL,
            name,
            body=client.V1DeleteOptions(propagation_policy="Foreground"),
        )
        log(f"deleted MPIJob {namespace}/{name} (foreground propagation)")
    except ApiException as exc:
        if exc.status != 404:
            raise
    end = time.monotonic() + timeout_s
    remaining: list[str] = []
    while True:
        job_gone = _get_job(api, namespace, name) is None
        remaining = [p.metadata.name for p in _pods_of(core, namespace, name)] if core else []
        if job_gone and not remaining:
            return []
        if time.monotonic() >= end:
            what = "the MPIJob" if not job_gone else f"pods {', '.join(sorted(remaining))}"
            log(f"WARNING: {what} of {namespace}/{name} still present after {timeout_s:.0f}s")
            return sorted(remaining)
        time.sleep(poll_interval_s)


def check_run(params: MPIJobParams, log: Log = print) -> RunSummary:
    """Check the finished run's outputs; return its run summary.

    The summary and the SavedModel must exist at the expected URIs, and the Horovod world size
    must equal workers x slots per worker.
    """
    train = params.train
    if not storage.exists(train.summary_uri):
        raise RunCheckError(
            f"the MPIJob succeeded but there is no run summary at {train.summary_uri}"
        )
    try:
        summary = parse(storage.read_text(train.summary_uri))
    except ValueError as exc:  # json.JSONDecodeError is a ValueError
        raise RunCheckError(f"run summary {train.summary_uri} is not JSON: {exc}") from exc
    if str(summary.get("model_uri", "")).rstrip("/") != train.model_uri.rstrip("/"):
        raise RunCheckError(
            f"run summary {train.summary_uri} names model_uri {summary.get('model_uri')!r}, "
            f"expected {train.model_uri!r}"
        )
    saved_model = storage.join(train.model_uri, "saved_model.pb")
    if not storage.exists(saved_model):
        raise RunCheckError(f"the MPIJob succeeded but there is no model at {saved_model}")
    for key, value in (("world_size", summary.get("world_size")),
                       ("expected_workers", summary.get("expected_workers"))):  # fmt: skip
        if value != train.world_size:
            raise RunCheckError(
                f"run summary {train.summary_uri} has {key}={value!r}, expected "
                f"workers x slots = {train.workers} x {train.slots_per_worker} = "
                f"{train.world_size}"
            )
    log(
        f"run summary at {train.summary_uri}: world_size {summary['world_size']}, "
        f"model {train.model_uri}"
    )
    return summary


def _add_owner(
    core: client.CoreV1Api, namespace: str, params: MPIJobParams, manifest: dict[str, Any], log: Log
) -> None:
    """Make the task's pod the job's owner when only the pod's name is known (reads its uid)."""
    if not params.owner_pod_name or params.owner_pod_uid:
        return  # no owner, or build_manifest already set it
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


def run_mpijob(
    params: MPIJobParams,
    *,
    namespace: str,
    api_client: client.ApiClient | None = None,
    poll_interval_s: float = 5.0,
    log: Log = print,
    crd_path: str | None = None,
    cleanup_timeout_s: float = 60.0,
    deadline_grace_s: float = DEADLINE_GRACE_S,
) -> RunSummary:
    """Run the trainer as an MPIJob and return its checked run summary.

    Raises `ManifestError` before contacting the cluster if the manifest is invalid,
    `MPIJobFailed` if the job fails, `MPIJobCancelled` on SIGTERM (after deleting the job), and
    `RunCheckError` if it succeeded without the expected outputs.
    """
    if not namespace:
        raise ValueError("namespace is empty")
    manifest = build_manifest(params, namespace)
    validate_manifest(manifest, crd_path)  # before any request
    name = manifest["metadata"]["name"]
    api_client = api_client or default_api_client()
    custom = client.CustomObjectsApi(api_client)
    core = client.CoreV1Api(api_client)
    with _sigterm_raises():
        try:
            _add_owner(core, namespace, params, manifest, log)
            create_or_reattach(
                custom, namespace, manifest, log=log, cleanup_timeout_s=cleanup_timeout_s
            )
            follow(
                custom,
                core,
                namespace,
                name,
                deadline_s=params.active_deadline_seconds + deadline_grace_s,
                poll_interval_s=poll_interval_s,
                log=log,
            )
        except (_Terminated, KeyboardInterrupt) as exc:
            log(f"task cancelled: deleting MPIJob {namespace}/{name}")
            left = delete_job(custom, core, namespace, name, log=log, timeout_s=cleanup_timeout_s)
            suffix = f"; pods still present: {', '.join(left)}" if left else ""
            raise MPIJobCancelled(f"cancelled; MPIJob {namespace}/{name} deleted{suffix}") from exc
    return check_run(params, log)
