"""Run the trainer as one MPIJob (mpi-operator, ``kubeflow.org/v2beta1``): `run_mpijob`.

The steps (create or reattach, follow the launcher's log, cancel, check the outputs) are the
cluster backends' shared ones (`components.train.cluster.run`); this module says what is the
MPIJob's own: its conditions and how its launcher pod is found.
"""

from __future__ import annotations

from kubernetes import client

from components.common import defaults
from components.train.cluster.lifecycle import (
    DEADLINE_GRACE_S,
    Backend,
    Log,
)
from components.train.cluster.params import ClusterJobParams
from components.train.cluster.run import run_job
from components.train.mpijob.manifest import LABEL_JOB, LABEL_ROLE, build_manifest
from components.train.mpijob.validate import MPIJOB, validate_manifest
from components.train.summary import RunSummary

# mpi-operator's own pod labels (a fallback when our template labels are absent).
OPERATOR_JOB_LABEL = "training.kubeflow.org/job-name"
OPERATOR_ROLE_LABEL = "training.kubeflow.org/job-role"


# An MPIJob's conditions: Created, Running, Restarting, Suspended, then Succeeded or Failed.
MPIJOB_BACKEND = Backend(
    crd=MPIJOB,
    terminal={"Failed": "Failed", "Succeeded": "Succeeded"},
    launcher_labels=lambda name: [
        {LABEL_JOB: name, LABEL_ROLE: "launcher"},
        {OPERATOR_JOB_LABEL: name, OPERATOR_ROLE_LABEL: "launcher"},
    ],
    launcher_container="launcher",
    pod_labels=lambda name: {LABEL_JOB: name},
    install=f"install mpi-operator {defaults.MPI_OPERATOR_VERSION} (docs/cluster.md), or choose "
    "training_backend=trainjob on a cluster with Kubeflow Trainer v2",
)


def run_mpijob(
    params: ClusterJobParams,
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

    Raises `ManifestError` before contacting the cluster if the manifest is invalid, then what
    `components.train.cluster.run.run_job` raises.
    """
    if not namespace:
        raise ValueError("namespace is empty")
    manifest = build_manifest(params, namespace)
    validate_manifest(manifest, crd_path)  # before any request
    return run_job(
        MPIJOB_BACKEND, params, manifest,
        api_client=api_client, poll_interval_s=poll_interval_s, log=log,
        cleanup_timeout_s=cleanup_timeout_s, deadline_grace_s=deadline_grace_s,
    )  # fmt: skip
