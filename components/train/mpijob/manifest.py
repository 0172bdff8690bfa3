"""The MPIJob manifest, built by a pure function from the pipeline parameters.

Nothing here talks to a cluster or reads the environment: `build_manifest` maps a
`ClusterJobParams` to the ``kubeflow.org/v2beta1`` MPIJob dict that `lifecycle` submits and
``python -m pipeline render-mpijob`` prints. What an MPIJob shares with a TrainJob (the
parameters, the name, the launcher's command, the pods' pieces) is in `components.train.cluster`.
"""

from __future__ import annotations

from typing import Any

from components.common import defaults
from components.train.cluster import pods
from components.train.cluster.params import ClusterJobParams, job_metadata, run_labels

API_GROUP = "kubeflow.org"
API_VERSION = "v2beta1"
PLURAL = "mpijobs"
KIND = "MPIJob"

# The pods' own labels, which is how the backend finds the launcher pod.
LABEL_JOB = "kfp-horovod/mpijob"
LABEL_ROLE = "kfp-horovod/role"


def _pod_template(
    p: ClusterJobParams, name: str, role: str, container: dict[str, Any]
) -> dict[str, Any]:
    gpus = role == "worker" and p.train.gpus_per_worker > 0
    return {
        "metadata": {"labels": {**run_labels(p), LABEL_JOB: name, LABEL_ROLE: role}},
        "spec": pods.pod_spec(p, container, gpus),
    }


def _launcher(p: ClusterJobParams) -> dict[str, Any]:
    container: dict[str, Any] = {
        "name": "launcher",
        "image": p.image,
        "imagePullPolicy": "IfNotPresent",
        "command": pods.launcher_command(p),
        "resources": pods.resources(p.launcher_cpu, p.launcher_memory, 0),
        "securityContext": pods.security_context(),
    }
    if env := pods.launcher_env(p):
        container["env"] = env
    return container


def _worker(p: ClusterJobParams) -> dict[str, Any]:
    return {**pods.sshd_container("worker", p.image), "resources": pods.worker_resources(p)}


def _run_policy(p: ClusterJobParams) -> dict[str, Any]:
    run_policy: dict[str, Any] = {
        "cleanPodPolicy": "Running",
        "ttlSecondsAfterFinished": p.ttl_seconds_after_finished,
        "backoffLimit": p.backoff_limit,
        "activeDeadlineSeconds": p.active_deadline_seconds,
    }
    scheduling: dict[str, Any] = {}
    if p.queue:
        scheduling["queue"] = p.queue
    if p.priority_class:
        scheduling["priorityClass"] = p.priority_class
    if p.min_available is not None:
        scheduling["minAvailable"] = p.min_available
    if scheduling:
        run_policy["schedulingPolicy"] = scheduling
    return run_policy


def build_manifest(p: ClusterJobParams, namespace: str | None = None) -> dict[str, Any]:
    """The MPIJob for `p`: one launcher running ``mpirun``, ``p.train.workers`` sshd workers."""
    metadata = job_metadata(p, namespace)
    name = str(metadata["name"])
    return {
        "apiVersion": f"{API_GROUP}/{API_VERSION}",
        "kind": KIND,
        "metadata": metadata,
        "spec": {
            "slotsPerWorker": p.train.slots_per_worker,
            "launcherCreationPolicy": "WaitForWorkersReady",
            "mpiImplementation": "OpenMPI",
            "sshAuthMountPath": defaults.MPI_SSH_AUTH_MOUNT_PATH,
            "runPolicy": _run_policy(p),
            "mpiReplicaSpecs": {
                "Launcher": {
                    "replicas": 1,
                    "restartPolicy": "OnFailure",
                    "template": _pod_template(p, name, "launcher", _launcher(p)),
                },
                "Worker": {
                    "replicas": p.train.workers,
                    "restartPolicy": "Never",
                    "template": _pod_template(p, name, "worker", _worker(p)),
                },
            },
        },
    }
