"""The MPIJob backend: mpi-operator's ``kubeflow.org/v2beta1`` MPIJob (one launcher running the
job's command, ``workers`` sshd workers), its CRD and its manifest. Runs in the train step's pod
and in the pipeline's CLI (``render-mpijob``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from components.common import defaults
from components.common.crd import Crd
from components.train.launcher.cluster import pods
from components.train.launcher.cluster.job import (
    LABEL_ROLE,
    ClusterJobKind,
    ClusterJobParams,
    job_metadata,
    run_labels,
)
from components.train.launcher.parameters import TrainStep

MPIJOB = Crd(
    "kubeflow.org",
    "v2beta1",
    "MPIJob",
    "mpijobs",
    relative_path=Path("deploy") / "crd" / "kubeflow.org_mpijobs.yaml",
    packaged_schema=Path(__file__).with_name("mpijob-v2beta1.schema.json"),
)
# The pods' own label (mpi-operator copies the templates' labels), how the run finds them.
LABEL_JOB = "kfp-horovod/mpijob"
LAUNCHER_CREATION_POLICIES = ("AtStartup", "WaitForWorkersReady")


def _pod_template(
    p: ClusterJobParams, name: str, role: str, container: dict[str, Any]
) -> dict[str, Any]:
    gpus = role == "worker" and p.train.gpus_per_worker > 0
    return {
        "metadata": {"labels": {**run_labels(p), LABEL_JOB: name, LABEL_ROLE: role}},
        "spec": pods.pod_spec(p, container, gpus),
    }


def _run_policy(step: TrainStep) -> dict[str, Any]:
    run_policy: dict[str, Any] = {
        "cleanPodPolicy": "Running",
        "ttlSecondsAfterFinished": step.ttl_seconds_after_finished,
        "backoffLimit": step.backoff_limit,
        "activeDeadlineSeconds": step.active_deadline_seconds,
    }
    gang = {
        "queue": step.queue,
        "priorityClass": step.priority_class,
        "minAvailable": step.min_available,
    }
    if scheduling := {key: value for key, value in gang.items() if value is not None}:
        run_policy["schedulingPolicy"] = scheduling
    return run_policy


def build_manifest(p: ClusterJobParams, namespace: str | None = None) -> dict[str, Any]:
    metadata = job_metadata(p, namespace)
    name = str(metadata["name"])
    worker = {**pods.sshd_container("worker", p.image), "resources": pods.worker_resources(p)}
    launcher = pods.container(
        "launcher",
        p.image,
        command=pods.launcher_command(p),
        env=pods.launcher_env(p),
        resources=pods.resources(p.step.launcher_cpu, p.step.launcher_memory, 0),
    )
    return {
        "apiVersion": MPIJOB.api_version,
        "kind": MPIJOB.kind,
        "metadata": metadata,
        "spec": {
            "slotsPerWorker": p.train.slots_per_worker,
            "launcherCreationPolicy": "WaitForWorkersReady",
            "mpiImplementation": "OpenMPI",
            "sshAuthMountPath": defaults.MPI_SSH_AUTH_MOUNT_PATH,
            "runPolicy": _run_policy(p.step),
            "mpiReplicaSpecs": {
                "Launcher": {
                    "replicas": 1,
                    "restartPolicy": "OnFailure",
                    "template": _pod_template(p, name, "launcher", launcher),
                },
                "Worker": {
                    "replicas": p.train.workers,
                    "restartPolicy": "Never",
                    "template": _pod_template(p, name, "worker", worker),
                },
            },
        },
    }


def problems(manifest: dict[str, Any]) -> list[str]:
    """What mpi-operator refuses that its CRD does not say: an unknown launcher policy."""
    policy = manifest.get("spec", {}).get("launcherCreationPolicy")
    if policy in (None, *LAUNCHER_CREATION_POLICIES):
        return []
    return [
        f"spec.launcherCreationPolicy: must be {' or '.join(LAUNCHER_CREATION_POLICIES)}, "
        f"got {policy!r}"
    ]


# An MPIJob's conditions: Created, Running, Restarting, Suspended, then Succeeded or Failed.
JOB_KIND = ClusterJobKind(
    name="mpijob",
    crd=MPIJOB,
    shared=(),
    build=lambda p, namespace: [build_manifest(p, namespace)],
    problems=problems,
    terminal={"Failed": "Failed", "Succeeded": "Succeeded"},
    pod_label=LABEL_JOB,
    launcher_label=(LABEL_ROLE, "launcher"),
    launcher_container="launcher",
    install=f"install mpi-operator {defaults.MPI_OPERATOR_VERSION} (docs/cluster.md), or choose "
    "training_backend=trainjob on a cluster with Kubeflow Trainer v2",
    deadline=("spec", "runPolicy", "activeDeadlineSeconds"),
    deadline_since="mpi-operator's first kubeflow.org/v2beta1 release",
)
