"""Run one cluster job through the official ``kubernetes`` client, the same steps for every
backend (`cluster.job.Backend`): `run_job`.

A job that an earlier attempt of the same task created is reattached to, unless it already
failed: that one is replaced, so a KFP retry really retries. Failure (eviction and the
operator's deadline included, and a client-side deadline backstop) raises `JobFailed` with the
launcher log's last lines; SIGTERM (the KFP task is cancelled) deletes the job with foreground
propagation and waits for its pods to go; success is checked against the run summary and the
model at their URIs.
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from components.common import storage
from components.train import summary
from components.train.cluster.crd import Crd
from components.train.cluster.job import (
    ANNOTATION_RUN_ID,
    ANNOTATION_RUN_NAME,
    SPEC_ANNOTATION,
    Backend,
    ClusterJobParams,
    JobCancelled,
    JobError,
    JobFailed,
    owner_reference,
    serves,
    validated,
)
from components.train.cluster.launcher_log import LauncherLog, pods_of
from components.train.summary import RunSummary

Log = Callable[[str], None]
DEADLINE_GRACE_S = 300.0


class _Terminated(BaseException):
    """Raised from the SIGTERM handler; a BaseException so no `except Exception` swallows it."""


def default_api_client() -> client.ApiClient:
    """An API client from the in-cluster service account, else from ``~/.kube/config``."""
    from kubernetes import config

    try:
        config.load_incluster_config()
    except config.ConfigException:
        config.load_kube_config()
    return client.ApiClient()


def get_object(
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


def create(api: client.CustomObjectsApi, crd: Crd, manifest: dict[str, Any]) -> bool:
    """Create `manifest` as `crd`'s kind; False if one of that name is there (409)."""
    try:
        api.create_namespaced_custom_object(
            crd.group, crd.version, manifest["metadata"]["namespace"], crd.plural, manifest
        )
    except ApiException as exc:
        if exc.status != 409:
            raise
        return False
    return True


def create_or_reattach(
    api: client.CustomObjectsApi,
    backend: Backend,
    manifest: dict[str, Any],
    *,
    log: Log = print,
    cleanup_timeout_s: float = 60.0,
) -> None:
    """Create the job, or reattach to the existing one of the same run (by its annotations);
    one that already failed is deleted and created anew."""
    namespace, name = manifest["metadata"]["namespace"], manifest["metadata"]["name"]
    what = backend.what(namespace, name)
    for _ in range(2):
        if create(api, backend.crd, manifest):
            log(f"created {what}")
            return
        existing = get_object(api, backend.crd, namespace, name)
        if existing is None:
            continue  # deleted between our create and get: create again
        want = manifest["metadata"]["annotations"]
        have = existing.get("metadata", {}).get("annotations") or {}
        for key in (ANNOTATION_RUN_ID, ANNOTATION_RUN_NAME):
            if have.get(key) != want.get(key):
                raise JobError(
                    f"{what} exists but belongs to another run ({key}={have.get(key)!r}, "
                    f"expected {want.get(key)!r}); refusing to reattach"
                )
        state = backend.state(existing)
        if state.phase != "Failed":
            log(f"reattached to {what} ({state.phase}) from an earlier attempt")
            return
        log(f"{what} from an earlier attempt failed ({state.reason}); replacing it")
        delete_job(
            api, None, backend, namespace, name,
            log=log, timeout_s=cleanup_timeout_s, poll_interval_s=0.5,
        )  # fmt: skip
    raise JobError(f"could not create {what}: it keeps reappearing")


def follow(
    api: client.CustomObjectsApi,
    core: client.CoreV1Api,
    backend: Backend,
    namespace: str,
    name: str,
    *,
    deadline_s: float,
    poll_interval_s: float = 5.0,
    log: Log = print,
) -> None:
    """Poll the job until it succeeds, or raise `JobFailed`; past `deadline_s` (a backstop on
    top of the job's own activeDeadlineSeconds) the job is deleted and the task fails."""
    launcher = LauncherLog(core, backend, namespace, name, log)
    what = backend.what(namespace, name)
    start = time.monotonic()
    last_phase = ""
    while True:
        job = get_object(api, backend.crd, namespace, name)
        launcher.poll()
        if job is None:
            raise JobFailed(
                what, "Deleted", "the job was deleted while running", list(launcher.tail)
            )
        state = backend.state(job)
        if state.phase != last_phase:
            said = ": ".join(part for part in (state.reason, state.message) if part)
            log(f"{what}: {state.phase}" + (f" ({said})" if said else ""))
            last_phase = state.phase
        if state.phase == "Succeeded":
            return
        if state.phase == "Failed":
            reason = state.reason or "Failed"
            if launcher.pod_reason == "Evicted" and "Evict" not in reason:
                reason = f"{reason} (launcher pod Evicted)"
            raise JobFailed(what, reason, state.message, list(launcher.tail))
        if time.monotonic() - start > deadline_s:
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
    """Delete the job (foreground: its pods go first) and wait for it and its pods (with `core`)
    to go; return the names of pods still present after `timeout_s`."""
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
        job_gone = get_object(api, crd, namespace, name) is None
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


def check_run(params: ClusterJobParams, kind: str, log: Log = print) -> RunSummary:
    """The finished run's summary, once it, the SavedModel and the world size (workers x slots
    per worker) are as expected; `JobError` names what is not."""
    train = params.train
    try:
        record = summary.read(train.summary_uri)
    except ValueError as exc:
        raise JobError(f"the {kind} succeeded but its {exc}") from exc
    if str(record.get("model_uri", "")).rstrip("/") != train.model_uri.rstrip("/"):
        raise JobError(
            f"run summary {train.summary_uri} names model_uri {record.get('model_uri')!r}, "
            f"expected {train.model_uri!r}"
        )
    saved_model = storage.join(train.model_uri, "saved_model.pb")
    if not storage.exists(saved_model):
        raise JobError(f"the {kind} succeeded but there is no model at {saved_model}")
    for key in ("world_size", "expected_workers"):
        if record.get(key) != train.world_size:
            raise JobError(
                f"run summary {train.summary_uri} has {key}={record.get(key)!r}, expected "
                f"workers x slots = {train.workers} x {train.slots_per_worker} = "
                f"{train.world_size}"
            )
    log(
        f"run summary at {train.summary_uri}: world_size {record['world_size']}, "
        f"model {train.model_uri}"
    )
    return record


def add_owner(
    core: client.CoreV1Api, params: ClusterJobParams, manifest: dict[str, Any], log: Log
) -> None:
    """Make the task's pod the job's owner when only the pod's name is known (reads its uid)."""
    if not params.owner_pod_name or params.owner_pod_uid:
        return  # no owner, or the manifest already has it
    try:
        pod = core.read_namespaced_pod(params.owner_pod_name, manifest["metadata"]["namespace"])
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


def ensure_shared(
    api: client.CustomObjectsApi, crd: Crd, manifest: dict[str, Any], log: Log
) -> None:
    """Create the shared object `manifest` (the TrainingRuntime) unless it is there: its name is
    its spec's hash, so one that is there is the same, unless someone changed it (refused)."""
    namespace, name = manifest["metadata"]["namespace"], manifest["metadata"]["name"]
    what = f"{crd.kind} {namespace}/{name}"
    existing = get_object(api, crd, namespace, name)
    if existing is None:
        if create(api, crd, manifest):
            log(f"created {what}")
            return
        existing = get_object(api, crd, namespace, name) or manifest  # another run made it
    want = manifest["metadata"]["annotations"][SPEC_ANNOTATION]
    have = (existing.get("metadata", {}).get("annotations") or {}).get(SPEC_ANNOTATION)
    if have != want:
        raise JobError(
            f"{what} exists but was not made from this spec ({SPEC_ANNOTATION}={have!r}, "
            f"expected {want!r}); delete it or leave the name to kfp-horovod"
        )
    log(f"using {what}")


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
        raise ValueError("namespace is empty")
    *shared, manifest = validated(b, params, namespace, crd_dir)
    name, what = manifest["metadata"]["name"], b.what(namespace, manifest["metadata"]["name"])
    api_client = api_client or default_api_client()
    custom, core = client.CustomObjectsApi(api_client), client.CoreV1Api(api_client)
    for crd in (b.crd, *b.shared):
        if not serves(custom, crd):
            raise JobError(
                f"this cluster does not serve {crd.kind} ({crd.plural}.{crd.api_version}): "
                f"{b.install}"
            )
    with _sigterm_raises():
        try:
            for crd, obj in zip(b.shared, shared, strict=True):
                ensure_shared(custom, crd, obj, log)
            add_owner(core, params, manifest, log)
            create_or_reattach(custom, b, manifest, log=log, cleanup_timeout_s=cleanup_timeout_s)
            follow(
                custom, core, b, namespace, name,
                deadline_s=params.step.active_deadline_seconds + deadline_grace_s,
                poll_interval_s=poll_interval_s, log=log,
            )  # fmt: skip
        except (_Terminated, KeyboardInterrupt) as exc:
            log(f"task cancelled: deleting {what}")
            left = delete_job(
                custom, core, b, namespace, name, log=log, timeout_s=cleanup_timeout_s
            )
            suffix = f"; pods still present: {', '.join(left)}" if left else ""
            raise JobCancelled(f"cancelled; {what} deleted{suffix}") from exc
    return check_run(params, b.crd.kind, log)
