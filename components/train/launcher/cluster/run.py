"""Run one cluster job through the official ``kubernetes`` client, the same steps for every kind
of job (`cluster.job.ClusterJobKind`): `run_job`. Runs in the train step's pod.
"""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from components.common import storage
from components.common.crd import Crd, raise_problems
from components.common.failure import SIGNAL_BASE, InputError, Stopped, stops_on_signals
from components.common.model_files import SAVED_MODEL_PB
from components.train import summary
from components.train.launcher.cluster.job import (
    ANNOTATION_RUN_ID,
    ANNOTATION_RUN_NAME,
    BY_STEP,
    SPEC_ANNOTATION,
    ClusterJobCancelled,
    ClusterJobError,
    ClusterJobFailed,
    ClusterJobKind,
    ClusterJobParams,
    Deadline,
    fit_deadline,
    serves,
)
from components.train.launcher.cluster.launcher_log import LauncherLog
from components.train.launcher.cluster.schema import Schema, served_schema
from components.train.summary import RunSummary

Log = Callable[[str], None]
DEADLINE_GRACE_S = 300.0  # past a deadline the cluster enforces, the train step's backstop


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
    """The cluster job `name`, of kind `b`, on the API, and the log its steps write to."""

    api: client.CustomObjectsApi
    core: client.CoreV1Api
    b: ClusterJobKind
    namespace: str
    name: str
    log: Log

    @property
    def what(self) -> str:
        return self.b.what(self.namespace, self.name)

    @property
    def container(self) -> str:
        return self.b.launcher_container

    def get(self, crd: Crd, name: str) -> dict[str, Any] | None:
        where = (crd.group, crd.version, self.namespace, crd.plural, name)
        try:
            return dict(self.api.get_namespaced_custom_object(*where))
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def create(self, crd: Crd, manifest: dict[str, Any]) -> bool:
        """False if one of that name is there (409); `ClusterJobError` if the server refuses it (a
        field its CRD lacks: Strict validation, or a value it does not accept)."""
        try:
            self.api.create_namespaced_custom_object(
                crd.group,
                crd.version,
                self.namespace,
                crd.plural,
                manifest,
                field_validation="Strict",
            )
        except ApiException as exc:
            if exc.status == 409:
                return False
            if exc.status not in (400, 422):
                raise
            what = f"{crd.kind} {self.namespace}/{manifest['metadata']['name']}"
            hint = f": {self.b.install}" if exc.status == 400 else ""
            raise ClusterJobError(f"the cluster refused {what}: {_message(exc)}{hint}") from exc
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
            raise ClusterJobError(
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
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "name": pod_name,
                "uid": uid,
                "controller": False,
                "blockOwnerDeletion": False,
            }
        ]

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
                raise ClusterJobError(
                    f"{self.what} exists but belongs to another run ({differs}); refusing to "
                    "reattach"
                )
            state = self.b.state(existing)
            if state.phase != "Failed":
                self.log(f"reattached to {self.what} ({state.phase}) from an earlier attempt")
                return
            self.log(f"{self.what} from an earlier attempt failed ({state.reason}); replacing it")
            self.delete(cleanup_timeout_s, poll_interval_s=0.5, pods=False)
        raise ClusterJobError(f"could not create {self.what}: it keeps reappearing")

    def follow(self, deadline: Deadline, poll_interval_s: float, grace_s: float) -> None:
        """Poll the job until it succeeds, or raise `ClusterJobFailed` (with the launcher log's last
        lines) while its log streams into ours. Past the deadline (where the cluster enforces
        it, `grace_s` past it, as a backstop), counted from the job's creation, delete it."""
        limit = deadline.seconds + (0.0 if deadline.by == BY_STEP else grace_s)
        with LauncherLog(self, poll_interval_s) as launcher:
            start, last_phase = None, ""
            while True:
                launcher.check()
                job = self.get(self.b.crd, self.name)
                if job is None:
                    raise _failed(self, launcher, "Deleted", "the job was deleted while running")
                start = start if start is not None else time.monotonic() - _age_s(job)
                state = self.b.state(job)
                if state.phase != last_phase:
                    said = ": ".join(part for part in (state.reason, state.message) if part)
                    self.log(f"{self.what}: {state.phase}" + (f" ({said})" if said else ""))
                    last_phase = state.phase
                if state.phase == "Succeeded":
                    launcher.close()
                    return
                if state.phase == "Failed":
                    raise _failed(self, launcher, state.reason or "Failed", state.message)
                if time.monotonic() - start > limit:
                    self.delete()
                    raise _failed(
                        self, launcher, "DeadlineExceeded", deadline.exceeded(state.phase, grace_s)
                    )
                time.sleep(poll_interval_s)

    def delete(
        self, timeout_s: float = 60.0, poll_interval_s: float = 1.0, pods: bool = True
    ) -> list[str]:
        """Delete the job (foreground: its pods go first) and wait for it (and with `pods`, its
        pods) to go; return the names of pods still present after `timeout_s`."""
        crd = self.b.crd
        try:
            self.api.delete_namespaced_custom_object(
                crd.group,
                crd.version,
                self.namespace,
                crd.plural,
                self.name,
                body=client.V1DeleteOptions(propagation_policy="Foreground"),
            )
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


def _failed(run: _Run, launcher: LauncherLog, reason: str, message: str) -> ClusterJobFailed:
    """`ClusterJobFailed` of `run` once the launcher's log has ended (an evicted launcher said)."""
    launcher.close()
    if reason != "DeadlineExceeded" and "Evict" not in reason:
        reason += " (launcher pod Evicted)" if launcher.pod_reason() == "Evicted" else ""
    return ClusterJobFailed(run.what, reason, message, list(launcher.tail))


def _age_s(job: dict[str, Any]) -> float:
    """Seconds since the job's creation (0 where the server gave no time)."""
    created = (job.get("metadata") or {}).get("creationTimestamp")
    try:
        return max(0.0, (datetime.now(UTC) - datetime.fromisoformat(str(created))).total_seconds())
    except ValueError:
        return 0.0


def _message(exc: ApiException) -> str:
    """The message of the API's Status in `exc`, else its reason."""
    try:
        return str(json.loads(exc.body)["message"])
    except (TypeError, ValueError, KeyError):
        return str(exc.reason)


def check_run(params: ClusterJobParams, kind: str, log: Log = print) -> RunSummary:
    """The finished run's summary, once it, the SavedModel and the world size (workers x slots
    per worker) are as expected; `ClusterJobError` names what is not."""
    train = params.train
    try:
        record = summary.read(train.summary_uri)
    except ValueError as exc:
        raise ClusterJobError(f"the {kind} succeeded but its {exc}") from exc
    if record.model_uri.rstrip("/") != train.model_uri.rstrip("/"):
        raise ClusterJobError(
            f"run summary {train.summary_uri} names model_uri {record.model_uri!r}, "
            f"expected {train.model_uri!r}"
        )
    saved_model = storage.join(train.model_uri, SAVED_MODEL_PB)
    if not storage.exists(saved_model):
        raise ClusterJobError(f"the {kind} succeeded but there is no model at {saved_model}")
    for key, value in (("world_size", record.world_size), ("workers", record.config.world_size)):
        if value != train.world_size:
            raise ClusterJobError(
                f"run summary {train.summary_uri} has {key}={value!r}, expected "
                f"workers x slots = {train.workers} x {train.slots_per_worker} = "
                f"{train.world_size}"
            )
    said = f"world_size {record.world_size}, model {train.model_uri}"
    log(f"run summary at {train.summary_uri}: {said}")
    return record


# Everything is created with ``fieldValidation=Strict``: the API server refuses a field its CRD
# lacks instead of dropping it. The job's deadline field is written only where the cluster's schema
# of the job has it; elsewhere the train step enforces the deadline itself. A job that an earlier
# attempt of the same task created is reattached to, unless it already failed: that one is replaced,
# so a KFP retry really retries. SIGTERM (the KFP task is cancelled) deletes the job with foreground
# propagation and waits for its pods to go.
def run_job(
    b: ClusterJobKind,
    params: ClusterJobParams,
    *,
    namespace: str,
    api_client: client.ApiClient | None = None,
    poll_interval_s: float = 5.0,
    log: Log = print,
    cleanup_timeout_s: float = 60.0,
    deadline_grace_s: float = DEADLINE_GRACE_S,
) -> RunSummary:
    """Run the trainer as backend `b`'s job in `namespace`; return its checked run summary,
    which says who enforced the deadline.

    InputError (what `b` cannot do, or what its operator refuses) comes before any request;
    then `ClusterJobError` (the cluster does not serve `b`'s APIs, refuses a manifest, or the
    outputs are wrong), `ClusterJobFailed` and `ClusterJobCancelled` (on SIGTERM, after
    deleting the job).
    """
    if not namespace:
        raise InputError("namespace is empty")
    *shared, manifest = b.build(params, namespace)
    raise_problems(manifest, b.crd, b.problems(manifest))
    api_client = api_client or default_api_client()
    custom, core = client.CustomObjectsApi(api_client), client.CoreV1Api(api_client)
    run = _Run(custom, core, b, namespace, manifest["metadata"]["name"], log)
    for crd in (b.crd, *b.shared):
        if not serves(custom, crd):
            raise ClusterJobError(
                f"this cluster does not serve {crd.kind} ({crd.plural}.{crd.api_version}): "
                f"{b.install}"
            )
    deadline = fit_deadline(
        b, manifest, params.step.active_deadline_seconds, _served_schema(api_client, b, log)
    )
    log(deadline.said(deadline_grace_s))
    with stops_on_signals():  # SIGTERM (KFP cancels the task) and Ctrl-C raise Stopped
        try:
            for crd, obj in zip(b.shared, shared, strict=True):
                run.ensure_shared(crd, obj)
            run.add_owner(params.owner_pod_name, manifest)
            run.create_or_reattach(manifest, cleanup_timeout_s)
            run.follow(deadline, poll_interval_s, deadline_grace_s)
        except KeyboardInterrupt as exc:
            log(f"task cancelled: deleting {run.what}")
            left = run.delete(cleanup_timeout_s)
            suffix = f"; pods still present: {', '.join(left)}" if left else ""
            code = exc.exit_code if isinstance(exc, Stopped) else SIGNAL_BASE + signal.SIGINT
            raise ClusterJobCancelled(f"cancelled; {run.what} deleted{suffix}", code) from exc
    record = check_run(params, b.crd.kind, log)
    record.deadline_enforced_by = deadline.by
    return record


def _served_schema(api_client: client.ApiClient, b: ClusterJobKind, log: Log) -> Schema | None:
    """The cluster's schema of `b`'s job, or None (said) if it publishes none."""
    schema = served_schema(api_client, b.crd)
    if schema is None:
        log(
            f"WARNING: this cluster publishes no OpenAPI v3 schema of {b.crd.kind} "
            f"{b.crd.api_version}; its deadline field is written, and the server refuses it "
            "(fieldValidation=Strict) if its CRD lacks it"
        )
    return schema
