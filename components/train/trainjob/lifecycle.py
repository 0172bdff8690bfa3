"""Run the trainer as one TrainJob (Kubeflow Trainer v2, ``trainer.kubeflow.org/v1alpha1``):
`run_trainjob`.

Before the shared steps (`components.train.cluster.run`: create or reattach, follow the
launcher's log, cancel, check the outputs), the project's TrainingRuntime is made if absent.
This module says what is the TrainJob's own: its runtime, its conditions (Complete, Failed,
Suspended) and how JobSet labels its launcher pod.
"""

from __future__ import annotations

from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from components.common import defaults
from components.train.cluster.discovery import check_api
from components.train.cluster.lifecycle import (
    DEADLINE_GRACE_S,
    Backend,
    JobError,
    Log,
    get_job,
)
from components.train.cluster.params import ClusterJobParams
from components.train.cluster.run import run_job
from components.train.summary import RunSummary
from components.train.trainjob.manifest import (
    JOBSET_NAME_LABEL,
    LAUNCHER,
    NODE,
    REPLICATED_JOB_LABEL,
    RUNTIME_SPEC_ANNOTATION,
    TRAINING_RUNTIME,
    TRAINJOB,
    build_manifests,
    validate_manifests,
)

INSTALL = (
    f"install Kubeflow Trainer {defaults.TRAINER_VERSION} (its CRDs, controller and JobSet; "
    "docs/cluster.md), or choose training_backend=mpijob on a cluster with mpi-operator"
)


# A TrainJob's conditions (trainjob_types.go): Suspended while it is, then Complete or Failed.
TRAINJOB_BACKEND = Backend(
    crd=TRAINJOB,
    terminal={"Failed": "Failed", "Complete": "Succeeded"},
    launcher_labels=lambda name: [{JOBSET_NAME_LABEL: name, REPLICATED_JOB_LABEL: LAUNCHER}],
    launcher_container=NODE,
    pod_labels=lambda name: {JOBSET_NAME_LABEL: name},
    install=INSTALL,
)


def _check_ours(existing: dict[str, Any], runtime: dict[str, Any]) -> None:
    """Refuse a runtime of our name whose spec is not the one its name was made from."""
    want = runtime["metadata"]["annotations"][RUNTIME_SPEC_ANNOTATION]
    have = (existing.get("metadata", {}).get("annotations") or {}).get(RUNTIME_SPEC_ANNOTATION)
    if have != want:
        meta = runtime["metadata"]
        raise JobError(
            f"TrainingRuntime {meta['namespace']}/{meta['name']} exists but was not made from "
            f"this spec ({RUNTIME_SPEC_ANNOTATION}={have!r}, expected {want!r}); delete it or "
            "leave the name to kfp-horovod"
        )


def ensure_runtime(api_client: client.ApiClient, runtime: dict[str, Any], log: Log) -> None:
    """Create the project's TrainingRuntime unless it is there already (its name is the hash
    of its spec, so one that is there is the same, unless someone changed it)."""
    custom = client.CustomObjectsApi(api_client)
    check_api(custom, TRAINING_RUNTIME, INSTALL)
    namespace, name = runtime["metadata"]["namespace"], runtime["metadata"]["name"]
    crd = TRAINING_RUNTIME
    existing = get_job(custom, crd, namespace, name)
    if existing is None:
        try:
            custom.create_namespaced_custom_object(
                crd.group, crd.version, namespace, crd.plural, runtime
            )
            log(f"created TrainingRuntime {namespace}/{name}")
            return
        except ApiException as exc:
            if exc.status != 409:  # 409: another run made it just now
                raise
        existing = get_job(custom, crd, namespace, name) or runtime
    _check_ours(existing, runtime)
    log(f"using TrainingRuntime {namespace}/{name}")


def run_trainjob(
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
    """Run the trainer as a TrainJob on the project's TrainingRuntime; return its checked run
    summary.

    Raises ValueError for what a TrainJob cannot do and `ManifestError` for a manifest its CRD
    refuses, both before contacting the cluster; then what
    `components.train.cluster.run.run_job` raises.
    """
    if not namespace:
        raise ValueError("namespace is empty")
    runtime, trainjob = build_manifests(params, namespace)
    validate_manifests(runtime, trainjob, crd_dir)  # before any request
    return run_job(
        TRAINJOB_BACKEND, params, trainjob,
        api_client=api_client, prepare=lambda api: ensure_runtime(api, runtime, log),
        poll_interval_s=poll_interval_s, log=log,
        cleanup_timeout_s=cleanup_timeout_s, deadline_grace_s=deadline_grace_s,
    )  # fmt: skip
