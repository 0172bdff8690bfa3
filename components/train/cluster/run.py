"""Run one cluster job through the official ``kubernetes`` client, the same steps for every
backend (`cluster.job.Backend`): `run_job`.

A job that an earlier attempt of the same task created is reattached to, unless it already
failed: that one is replaced, so a KFP retry really retries. SIGTERM (the KFP task is
cancelled) deletes the job with foreground propagation and waits for its pods to go.
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
from components.common.crd import Crd
from components.common.failure import InputError
from components.common.model_files import SAVED_MODEL_PB
from components.train import summary
from components.train.cluster.job import (
    ANNOTATION_RUN_ID,
    ANNOTATION_RUN_NAME,
    SPEC_ANNOTATION,
    Backend,
    ClusterJobParams,
    JobCancelled,
    JobError,
    JobFailed,
    serves,
    validated,
)
from components.train.mpiwatch import RankLines
from components.train.summary import RunSummary

Log = Callable[[str], None]
DEADLINE_GRACE_S = 300.0
LOG_TAIL_LINES = 50


def default_api_client() -> client.ApiClient:
    """An API client from the in-cluster service account, else from ``~/.kube/config``."""
    from kubernetes import config

    try:
        config.load_incluster_config()
    except config.ConfigException:
        config.load_kube_config()
    return client.ApiClient()


def _differs(existing: dict[str, Any], manifest: dict[str, Any], *keys: str) -> str:
    """``key=<existing's>, expected <manifest's>`` of the first annotation of `keys` that
    `existing` has otherwise than `manifest`; empty if none."""
    want = manifest["metadata"]["annotations"]
    have = existing.get("metadata", {}).get("annotations") or {}
    for key in keys:
        if have.get(key) != want.get(key):
            return f"{key}={have.get(key)!r}, expected {want.get(key)!r}"
    return ""


@dataclass(frozen=True)
class _Run:
    """Job `name` of backend `b` on the API, and the log its steps write to."""

    api: client.CustomObjectsApi
    core: client.CoreV1Api
    b: Backend
    namespace: str
    name: str
    log: Log

    @property
    def what(self) -> str:
        return self.b.what(self.namespace, self.name)

    def get(self, crd: Crd, name: str) -> dict[str, Any] | None:
        where = (crd.group, crd.version, self.namespace, crd.plural, name)
        try:
            return dict(self.api.get_namespaced_custom_object(*where))
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def create(self, crd: Crd, manifest: dict[str, Any]) -> bool:
        """False if one of that name is there (409)."""
        try:
            self.api.create_namespaced_custom_object(
                crd.group, crd.version, self.namespace, crd.plural, manifest
            )
        except ApiException as exc:
            if exc.status != 409:
                raise
            return False
        return True

    def pods(self, launcher: bool = False) -> list[Any]:
        """The job's pods (or its launcher's), by label: also checked here, in case a server
        ignores the selector."""
        labels = {self.b.pod_label: self.name}
        if launcher:
            labels.update([self.b.launcher_label])
        selector = ",".join(f"{key}={value}" for key, value in labels.items())
        found = self.core.list_namespaced_pod(self.namespace, label_selector=selector).items
        return [p for p in found if labels.items() <= (p.metadata.labels or {}).items()]

    def ensure_shared(self, crd: Crd, manifest: dict[str, Any]) -> None:
        """Create the shared object `manifest` (the TrainingRuntime) unless it is there: its
        name is its spec's hash, so one that is there is the same, unless someone changed it."""
        name = manifest["metadata"]["name"]
        what = f"{crd.kind} {self.namespace}/{name}"
        existing = self.get(crd, name)
        if existing is None:
            if self.create(crd, manifest):
                self.log(f"created {what}")
                return
            existing = self.get(crd, name) or manifest  # another run made it
        if differs := _differs(existing, manifest, SPEC_ANNOTATION):
            raise JobError(
                f"{what} exists but was not made from this spec ({differs}); delete it or leave "
                "the name to kfp-horovod"
            )
        self.log(f"using {what}")

    def add_owner(self, pod_name: str | None, manifest: dict[str, Any]) -> None:
        """Make the task's pod `pod_name` the job's owner: the job is garbage-collected with it."""
        if not pod_name:
            return
        try:
            uid = self.core.read_namespaced_pod(pod_name, self.namespace).metadata.uid
        except ApiException as exc:
            self.log(
                f"WARNING: cannot read owner pod {pod_name} ({exc.status}); no owner reference"
            )
            return
        manifest["metadata"]["ownerReferences"] = [
            {"apiVersion": "v1", "kind": "Pod", "name": pod_name, "uid": uid,
             "controller": False, "blockOwnerDeletion": False}
        ]  # fmt: skip

    def create_or_reattach(self, manifest: dict[str, Any], cleanup_timeout_s: float) -> None:
        """Create the job, or reattach to the existing one of the same run (by its
        annotations); one that already failed is deleted and created anew."""
        for _ in range(2):
            if self.create(self.b.crd, manifest):
                self.log(f"created {self.what}")
                return
            existing = self.get(self.b.crd, self.name)
            if existing is None:
                continue  # deleted between our create and get: create again
            if differs := _differs(existing, manifest, ANNOTATION_RUN_ID, ANNOTATION_RUN_NAME):
                raise JobError(
                    f"{self.what} exists but belongs to another run ({differs}); refusing to "
                    "reattach"
                )
            state = self.b.state(existing)
            if state.phase != "Failed":
                self.log(f"reattached to {self.what} ({state.phase}) from an earlier attempt")
                return
            self.log(f"{self.what} from an earlier attempt failed ({state.reason}); replacing it")
            self.delete(cleanup_timeout_s, poll_interval_s=0.5, pods=False)
        raise JobError(f"could not create {self.what}: it keeps reappearing")

    def follow(self, deadline_s: float, poll_interval_s: float) -> None:
        """Poll the job until it succeeds, or raise `JobFailed` (with the launcher log's last
        lines); past `deadline_s`, a backstop to the job's own deadline, delete it first."""
        launcher = LauncherLog(self)
        start = time.monotonic()
        last_phase = ""
        while True:
            job = self.get(self.b.crd, self.name)
            launcher.poll()
            tail = list(launcher.tail)
            if job is None:
                raise JobFailed(self.what, "Deleted", "the job was deleted while running", tail)
            state = self.b.state(job)
            if state.phase != last_phase:
                said = ": ".join(part for part in (state.reason, state.message) if part)
                self.log(f"{self.what}: {state.phase}" + (f" ({said})" if said else ""))
                last_phase = state.phase
            if state.phase == "Succeeded":
                return
            if state.phase == "Failed":
                reason = state.reason or "Failed"
                if launcher.pod_reason == "Evicted" and "Evict" not in reason:
                    reason = f"{reason} (launcher pod Evicted)"
                raise JobFailed(self.what, reason, state.message, tail)
            if time.monotonic() - start > deadline_s:
                self.delete()
                still = f"still {state.phase} after {deadline_s:.0f}s; the job was deleted"
                raise JobFailed(self.what, "DeadlineExceeded", still, tail)
            time.sleep(poll_interval_s)

    def delete(
        self, timeout_s: float = 60.0, poll_interval_s: float = 1.0, pods: bool = True
    ) -> list[str]:
        """Delete the job (foreground: its pods go first) and wait for it (and with `pods`, its
        pods) to go; return the names of pods still present after `timeout_s`."""
        crd = self.b.crd
        try:
            self.api.delete_namespaced_custom_object(
                crd.group, crd.version, self.namespace, crd.plural, self.name,
                body=client.V1DeleteOptions(propagation_policy="Foreground"),
            )  # fmt: skip
            self.log(f"deleted {self.what} (foreground propagation)")
        except ApiException as exc:
            if exc.status != 404:
                raise
        end = time.monotonic() + timeout_s
        while True:
            job_gone = self.get(crd, self.name) is None
            remaining = sorted(p.metadata.name for p in self.pods()) if pods else []
            if job_gone and not remaining:
                return []
            if time.monotonic() >= end:
                left = f"the {crd.kind}" if not job_gone else f"pods {', '.join(remaining)}"
                self.log(
                    f"WARNING: {left} of {self.namespace}/{self.name} still present after "
                    f"{timeout_s:.0f}s"
                )
                return remaining
            time.sleep(poll_interval_s)


class LauncherLog:
    """Copies new lines of the launcher pod's log into the run's log, and keeps the last ones:
    each poll reads the whole log of the newest launcher pod and emits the lines past those
    already emitted; a new launcher pod (or a restarted container whose log is shorter) starts
    over."""

    def __init__(self, run: _Run) -> None:
        self.run, self.log = run, RankLines(run.log)  # each line once: components.train.mpiwatch
        self.pod_name: str | None = None
        self.emitted, self.pod_reason = 0, ""
        self.tail: collections.deque[str] = collections.deque(maxlen=LOG_TAIL_LINES)

    def poll(self) -> None:
        pods = self.run.pods(launcher=True)
        if not pods:
            return
        pod = max(pods, key=lambda p: (str(p.metadata.creation_timestamp or ""), p.metadata.name))
        self.pod_reason = (pod.status.reason or "") if pod.status else ""
        if pod.metadata.name != self.pod_name:
            if self.pod_name is not None:
                self.log(f"--- new launcher pod {pod.metadata.name} ---")
            self.pod_name, self.emitted = pod.metadata.name, 0
        try:
            text = self.run.core.read_namespaced_pod_log(
                pod.metadata.name, self.run.namespace, container=self.run.b.launcher_container
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


def check_run(params: ClusterJobParams, kind: str, log: Log = print) -> RunSummary:
    """The finished run's summary, once it, the SavedModel and the world size (workers x slots
    per worker) are as expected; `JobError` names what is not."""
    train = params.train
    try:
        record = summary.read(train.summary_uri)
    except ValueError as exc:
        raise JobError(f"the {kind} succeeded but its {exc}") from exc
    if record.model_uri.rstrip("/") != train.model_uri.rstrip("/"):
        raise JobError(
            f"run summary {train.summary_uri} names model_uri {record.model_uri!r}, "
            f"expected {train.model_uri!r}"
        )
    saved_model = storage.join(train.model_uri, SAVED_MODEL_PB)
    if not storage.exists(saved_model):
        raise JobError(f"the {kind} succeeded but there is no model at {saved_model}")
    for key, value in (("world_size", record.world_size), ("workers", record.config.world_size)):
        if value != train.world_size:
            raise JobError(
                f"run summary {train.summary_uri} has {key}={value!r}, expected "
                f"workers x slots = {train.workers} x {train.slots_per_worker} = "
                f"{train.world_size}"
            )
    said = f"world_size {record.world_size}, model {train.model_uri}"
    log(f"run summary at {train.summary_uri}: {said}")
    return record


@contextlib.contextmanager
def _sigterm_interrupts() -> Iterator[None]:
    """Within the block, SIGTERM raises KeyboardInterrupt as Ctrl-C does, which no `except
    Exception` swallows (only the main thread can set handlers)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def run_job(
    b: Backend,
    params: ClusterJobParams,
    *,
    namespace: str,
    api_client: client.ApiClient | None = None,
    poll_interval_s: float = 5.0,
    log: Log = print,
    crd_dir: str | None = None,
    cleanup_timeout_s: float = 60.0,
    deadline_grace_s: float = DEADLINE_GRACE_S,
) -> RunSummary:
    """Run the trainer as backend `b`'s job in `namespace`; return its checked run summary.

    ValueError (what `b` cannot do, or a manifest its CRD refuses) comes before any request;
    then `JobError` (the cluster does not serve `b`'s APIs, or the outputs are wrong),
    `JobFailed` and `JobCancelled` (on SIGTERM, after deleting the job).
    """
    if not namespace:
        raise InputError("namespace is empty")
    *shared, manifest = validated(b, params, namespace, crd_dir)
    api_client = api_client or default_api_client()
    custom, core = client.CustomObjectsApi(api_client), client.CoreV1Api(api_client)
    run = _Run(custom, core, b, namespace, manifest["metadata"]["name"], log)
    for crd in (b.crd, *b.shared):
        if not serves(custom, crd):
            raise JobError(
                f"this cluster does not serve {crd.kind} ({crd.plural}.{crd.api_version}): "
                f"{b.install}"
            )
    with _sigterm_interrupts():
        try:
            for crd, obj in zip(b.shared, shared, strict=True):
                run.ensure_shared(crd, obj)
            run.add_owner(params.owner_pod_name, manifest)
            run.create_or_reattach(manifest, cleanup_timeout_s)
            run.follow(params.step.active_deadline_seconds + deadline_grace_s, poll_interval_s)
        except KeyboardInterrupt as exc:
            log(f"task cancelled: deleting {run.what}")
            left = run.delete(cleanup_timeout_s)
            suffix = f"; pods still present: {', '.join(left)}" if left else ""
            raise JobCancelled(f"cancelled; {run.what} deleted{suffix}") from exc
    return check_run(params, b.crd.kind, log)
