"""Run one cluster job through the official ``kubernetes`` client: create or reattach, follow,
cancel, check. The same steps for an MPIJob and a TrainJob; a `Backend` says what differs.

1. check that the cluster serves the job's API (else say which operator to install:
   `components.train.cluster.discovery`);
2. create the job, or reattach to the one an earlier attempt of the same task created
   (a job that already *failed* is replaced, so a KFP retry really retries);
3. poll the job's conditions and copy the launcher pod's new log lines into the component's log;
4. on Failed (eviction and the operator's deadline included), or when the client-side deadline
   backstop passes, raise `JobFailed` with the reason and the launcher log's last lines;
5. on SIGTERM (the KFP task is cancelled), delete the job with foreground propagation, wait
   for its pods to go, and raise `JobCancelled`;
6. on success, check the run summary and the model at their URIs and the world size.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from components.train.cluster.crd import Crd
from components.train.cluster.params import ANNOTATION_RUN_ID, ANNOTATION_RUN_NAME
from components.train.mpiwatch import RankLines

Log = Callable[[str], None]
LOG_TAIL_LINES = 50
DEADLINE_GRACE_S = 300.0


class JobError(RuntimeError):
    """Base class of the cluster backends' run-time errors."""


class JobFailed(JobError):
    """The job failed; carries the reason and the launcher log's last lines."""

    def __init__(self, what: str, reason: str, message: str, log_tail: list[str]) -> None:
        self.what, self.reason, self.message, self.log_tail = what, reason, message, log_tail
        tail = "\n".join(log_tail) if log_tail else "(no launcher log)"
        super().__init__(
            f"{what} failed: {reason}: {message}\n"
            f"--- last {len(log_tail)} lines of the launcher log ---\n{tail}"
        )


class JobCancelled(JobError):
    """The task was cancelled (SIGTERM); the job was deleted."""


class RunCheckError(JobError):
    """The job succeeded but its outputs are missing or wrong; the message names which."""


@dataclass(frozen=True)
class JobState:
    """Where the job is: Pending (no condition yet), Created, Running, Restarting, Suspended,
    Succeeded or Failed, with the condition's reason and message."""

    phase: str
    reason: str = ""
    message: str = ""


@dataclass(frozen=True)
class Backend:
    """What one kind of cluster job needs beside the shared steps.

    `terminal` maps the job's terminal condition types to Failed or Succeeded (`state`); the
    launcher pod is the pod whose labels include one of `launcher_labels(name)`, its log is
    container `launcher_container`'s; the job's pods carry `pod_labels(name)`; `install` says
    what to install when the cluster does not serve the job's API.
    """

    crd: Crd
    terminal: Mapping[str, str]
    launcher_labels: Callable[[str], list[dict[str, str]]]
    launcher_container: str
    pod_labels: Callable[[str], dict[str, str]]
    install: str

    def what(self, namespace: str, name: str) -> str:
        """``<Kind> <namespace>/<name>``, as every message names the job."""
        return f"{self.crd.kind} {namespace}/{name}"

    def state(self, job: Mapping[str, Any]) -> JobState:
        """The job's state from its true ``status.conditions``: a terminal one wins (Failed
        first), else the newest by ``lastTransitionTime`` (the later listed on a tie), else
        what `jobs_state` reads from ``status.jobsStatus``."""
        conditions = [
            c
            for c in (job.get("status") or {}).get("conditions") or []
            if c.get("status") == "True"
        ]
        by_type = {c.get("type"): c for c in conditions}
        for kind, phase in sorted(self.terminal.items(), key=lambda kp: kp[1] != "Failed"):
            if kind in by_type:
                return JobState(
                    phase, by_type[kind].get("reason", ""), by_type[kind].get("message", "")
                )
        if not conditions:
            return jobs_state(job)
        latest = max(
            enumerate(conditions), key=lambda ic: (ic[1].get("lastTransitionTime") or "", ic[0])
        )[1]
        return JobState(
            latest.get("type", "Unknown"), latest.get("reason", ""), latest.get("message", "")
        )


def jobs_state(job: Mapping[str, Any]) -> JobState:
    """Running while one of the job's child jobs has an active pod, else Pending, from
    ``status.jobsStatus`` (a TrainJob's: Trainer sets no condition while it runs, only the
    JobSet's replicated jobs' counts); the message counts each one's ready and active pods."""
    jobs = (job.get("status") or {}).get("jobsStatus") or []
    if not any(j.get("active") for j in jobs):
        return JobState("Pending")
    counts = ", ".join(
        f"{j.get('name')}: {j.get('ready') or 0} ready of {j.get('active') or 0} active"
        for j in jobs
    )
    return JobState("Running", "", counts)


def default_api_client() -> client.ApiClient:
    """An API client from the in-cluster service account, else from ``~/.kube/config``."""
    from kubernetes import config

    try:
        config.load_incluster_config()
    except config.ConfigException:
        config.load_kube_config()
    return client.ApiClient()


def get_job(
    api: client.CustomObjectsApi, crd: Crd, namespace: str, name: str
) -> dict[str, Any] | None:
    """The object `name` of `crd`'s kind, or None if there is none."""
    try:
        return dict(
            api.get_namespaced_custom_object(crd.group, crd.version, namespace, crd.plural, name)
        )
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise


def _check_same_run(what: str, existing: dict[str, Any], manifest: dict[str, Any]) -> None:
    """Refuse to adopt a job of the same name that belongs to another run."""
    want = manifest["metadata"]["annotations"]
    have = existing.get("metadata", {}).get("annotations") or {}
    for key in (ANNOTATION_RUN_ID, ANNOTATION_RUN_NAME):
        if have.get(key) != want.get(key):
            raise JobError(
                f"{what} exists but belongs to another run ({key}={have.get(key)!r}, expected "
                f"{want.get(key)!r}); refusing to reattach"
            )


def create_or_reattach(
    api: client.CustomObjectsApi,
    backend: Backend,
    manifest: dict[str, Any],
    *,
    log: Log = print,
    cleanup_timeout_s: float = 60.0,
) -> tuple[dict[str, Any], bool]:
    """Create the job, or return the existing one of the same run; ``(job, reattached)``.

    An existing job that already failed is deleted and created anew, so a retried task retries.
    """
    crd, namespace = backend.crd, manifest["metadata"]["namespace"]
    name = manifest["metadata"]["name"]
    what = backend.what(namespace, name)
    for _ in range(2):
        try:
            job = api.create_namespaced_custom_object(
                crd.group, crd.version, namespace, crd.plural, manifest
            )
            log(f"created {what}")
            return dict(job), False
        except ApiException as exc:
            if exc.status != 409:
                raise
        existing = get_job(api, crd, namespace, name)
        if existing is None:
            continue  # deleted between our create and get: create again
        _check_same_run(what, existing, manifest)
        state = backend.state(existing)
        if state.phase != "Failed":
            log(f"reattached to {what} ({state.phase}) from an earlier attempt")
            return existing, True
        log(f"{what} from an earlier attempt failed ({state.reason}); replacing it")
        delete_job(
            api, None, backend, namespace, name,
            log=log, timeout_s=cleanup_timeout_s, poll_interval_s=0.5,
        )  # fmt: skip
    raise JobError(f"could not create {what}: it keeps reappearing")


def _has_labels(pod: Any, labels: Mapping[str, str]) -> bool:
    have = pod.metadata.labels or {}
    return all(have.get(key) == value for key, value in labels.items())


def _selector(labels: Mapping[str, str]) -> str:
    return ",".join(f"{key}={value}" for key, value in labels.items())


def pods_of(core: client.CoreV1Api, backend: Backend, namespace: str, name: str) -> list[Any]:
    """The job's pods; the label selector is also applied here in case a server ignores it."""
    labels = backend.pod_labels(name)
    pods = core.list_namespaced_pod(namespace, label_selector=_selector(labels)).items
    return [p for p in pods if _has_labels(p, labels)]


def find_launcher_pod(
    core: client.CoreV1Api, backend: Backend, namespace: str, name: str
) -> Any | None:
    """The newest launcher pod of job `name`, or None before it exists."""
    choices = backend.launcher_labels(name)
    pods = [
        p
        for p in core.list_namespaced_pod(namespace, label_selector=_selector(choices[0])).items
        if any(_has_labels(p, labels) for labels in choices)
    ]
    if not pods:
        return None
    return max(pods, key=lambda p: (str(p.metadata.creation_timestamp or ""), p.metadata.name))


class LauncherLog:
    """Copies new lines of the launcher pod's log into `log`, and keeps the last ones.

    Each poll reads the launcher container's whole log and emits the lines past those already
    emitted; a new launcher pod (or a restarted container whose log is shorter) starts over.
    """

    def __init__(
        self, core: client.CoreV1Api, backend: Backend, namespace: str, name: str, log: Log
    ) -> None:
        self.core, self.backend, self.namespace, self.name = core, backend, namespace, name
        self.log = RankLines(log)  # each line once: components.train.mpiwatch
        self.pod_name: str | None = None
        self.emitted = 0
        self.tail: collections.deque[str] = collections.deque(maxlen=LOG_TAIL_LINES)
        self.pod_reason = ""

    def poll(self) -> None:
        """Emit the launcher's new lines (no-op until its container has started)."""
        pod = find_launcher_pod(self.core, self.backend, self.namespace, self.name)
        if pod is None:
            return
        self.pod_reason = (pod.status.reason or "") if pod.status else ""
        if pod.metadata.name != self.pod_name:
            if self.pod_name is not None:
                self.log(f"--- new launcher pod {pod.metadata.name} ---")
            self.pod_name, self.emitted = pod.metadata.name, 0
        try:
            text = self.core.read_namespaced_pod_log(
                pod.metadata.name, self.namespace, container=self.backend.launcher_container
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
    backend: Backend,
    namespace: str,
    name: str,
    *,
    deadline_s: float | None,
    poll_interval_s: float = 5.0,
    log: Log = print,
) -> dict[str, Any]:
    """Poll the job until it succeeds (return it) or fails (raise `JobFailed`).

    `deadline_s` is a client-side backstop on top of the job's own activeDeadlineSeconds:
    if it passes with the job still unfinished, the job is deleted and the task fails.
    """
    launcher = LauncherLog(core, backend, namespace, name, log)
    what = backend.what(namespace, name)
    start = time.monotonic()
    last_phase = ""
    while True:
        job = get_job(api, backend.crd, namespace, name)
        launcher.poll()
        if job is None:
            raise JobFailed(
                what, "Deleted", "the job was deleted while running", list(launcher.tail)
            )
        state = backend.state(job)
        if state.phase != last_phase:
            said = ": ".join(part for part in (state.reason, state.message) if part)
            detail = f" ({said})" if said else ""
            log(f"{what}: {state.phase}{detail}")
            last_phase = state.phase
        if state.phase == "Succeeded":
            return job
        if state.phase == "Failed":
            reason = state.reason or "Failed"
            if launcher.pod_reason == "Evicted" and "Evict" not in reason:
                reason = f"{reason} (launcher pod Evicted)"
            raise JobFailed(what, reason, state.message, list(launcher.tail))
        if deadline_s is not None and time.monotonic() - start > deadline_s:
            delete_job(api, core, backend, namespace, name, log=log)
            raise JobFailed(
                what, "DeadlineExceeded",
                f"still {state.phase} after {deadline_s:.0f}s; the job was deleted",
                list(launcher.tail),
            )  # fmt: skip
        time.sleep(poll_interval_s)


def delete_job(
    api: client.CustomObjectsApi,
    core: client.CoreV1Api | None,
    backend: Backend,
    namespace: str,
    name: str,
    *,
    log: Log = print,
    timeout_s: float = 60.0,
    poll_interval_s: float = 1.0,
) -> list[str]:
    """Delete the job (foreground: its pods go first) and wait for it and its pods to go.

    Returns the names of pods still present after `timeout_s` (empty when clean); with
    `core` None only the job itself is waited for.
    """
    crd, what = backend.crd, backend.what(namespace, name)
    try:
        api.delete_namespaced_custom_object(
            crd.group, crd.version, namespace, crd.plural, name,
            body=client.V1DeleteOptions(propagation_policy="Foreground"),
        )  # fmt: skip
        log(f"deleted {what} (foreground propagation)")
    except ApiException as exc:
        if exc.status != 404:
            raise
    end = time.monotonic() + timeout_s
    while True:
        job_gone = get_job(api, crd, namespace, name) is None
        remaining = (
            [p.metadata.name for p in pods_of(core, backend, namespace, name)] if core else []
        )
        if job_gone and not remaining:
            return []
        if time.monotonic() >= end:
            left = f"the {crd.kind}" if not job_gone else f"pods {', '.join(sorted(remaining))}"
            log(f"WARNING: {left} of {namespace}/{name} still present after {timeout_s:.0f}s")
            return sorted(remaining)
        time.sleep(poll_interval_s)
