"""The TrainJob backend: the same Horovod job as the MPIJob's, run by Kubeflow Trainer v2
(``trainer.kubeflow.org/v1alpha1``) on the project's own TrainingRuntime (trainjob.md says how
Trainer v2.3 runs it, as read from its source). Runs in the train step's pod and in the
pipeline's CLI (``render-trainjob``).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from components.common import defaults
from components.common.crd import Crd
from components.common.failure import InputError
from components.train.launcher.cluster import pods
from components.train.launcher.cluster.job import (
    APP_LABELS,
    LABEL_ROLE,
    SPEC_ANNOTATION,
    ClusterJobKind,
    ClusterJobParams,
    job_metadata,
)
from components.train.launcher.parameters import TrainStep, elastic_backend_problem

# Trainer's built-in MPI runtimes run other images, and a TrainJob's image reaches its launcher
# alone (kubeflow/trainer#4030), so the project ships its own runtime with the trainer image on both
# of its jobs (``node``: the sshd workers; ``launcher``: node 0 too, started once the nodes are
# ready). What the TrainJob API cannot say per run (the image on the nodes, the pods' identity,
# scheduling and security, TTL, restarts) is in that runtime, named by its spec's hash: runs with
# the same settings share one, and no run changes one another run uses.
API_GROUP = "trainer.kubeflow.org"
API_VERSION = "v1alpha1"
_CRDS = Path("deploy") / "crd" / "trainer" / defaults.TRAINER_VERSION  # one folder per release
TRAINJOB = Crd(
    API_GROUP,
    API_VERSION,
    "TrainJob",
    "trainjobs",
    relative_path=_CRDS / "trainer.kubeflow.org_trainjobs.yaml",
    packaged_schema=Path(__file__).with_name("trainjob-v1alpha1.schema.json"),
)
TRAINING_RUNTIME = Crd(
    API_GROUP,
    API_VERSION,
    "TrainingRuntime",
    "trainingruntimes",
    relative_path=_CRDS / "trainer.kubeflow.org_trainingruntimes.yaml",
    packaged_schema=Path(__file__).with_name("trainingruntime-v1alpha1.schema.json"),
)

# Kubeflow Trainer's names (pkg/constants/constants.go at v2.3.0).
ANCESTOR_LABEL = "trainer.kubeflow.org/trainjob-ancestor-step"
ANCESTOR_TRAINER = "trainer"
NODE = "node"  # the node job, and every container's (only those get Trainer's SSH files)
LAUNCHER = "launcher"
# Trainer sets these on the launcher itself and refuses a TrainJob that sets one (MPI plugin).
RESERVED_ENV = (
    "OMPI_MCA_orte_default_hostfile",
    "OMPI_MCA_plm_rsh_args",
    "OMPI_MCA_orte_keep_fqdn_hostnames",
    "OMPI_MCA_orte_set_default_slots",
)
# What a TrainJob cannot take: its launcher is node 0 (sized as a worker), and its gang
# scheduling is the runtime's.
GANG = "is an MPIJob scheduling policy; a TrainJob is gang-scheduled through its runtime's "
REFUSED = {
    "queue": GANG + "podGroupPolicy or Kueue, not by this parameter",
    "min_available": GANG + "podGroupPolicy or Kueue, not by this parameter",
    "launcher_cpu": "does not apply to a TrainJob: its launcher is node 0 and gets cpu_per_worker",
    "launcher_memory": "does not apply to a TrainJob: its launcher is node 0 and gets "
    "memory_per_worker",
}
# JobSet's labels on every pod it makes.
JOBSET_NAME_LABEL = "jobset.sigs.k8s.io/jobset-name"
REPLICATED_JOB_LABEL = "jobset.sigs.k8s.io/replicatedjob-name"


def env_problems(manifest: dict[str, Any]) -> list[str]:
    """The names in a TrainJob's env that Trainer reserves for itself (it would refuse them)."""
    env = manifest.get("spec", {}).get("trainer", {}).get("env", [])
    return [
        f"spec.trainer.env: {e['name']} is reserved by Kubeflow Trainer's MPI plugin"
        for e in env
        if e["name"] in RESERVED_ENV
    ]


def _replicated_job(name: str, container: dict[str, Any], p: ClusterJobParams) -> dict[str, Any]:
    gpus = p.train.gpus_per_worker > 0
    labels = {**APP_LABELS, LABEL_ROLE: name}
    job: dict[str, Any] = {
        "name": name,
        "template": {
            "spec": {
                "backoffLimit": 0,
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {**pods.pod_spec(p, container, gpus), "restartPolicy": "Never"},
                },
            }
        },
    }
    if name == LAUNCHER:
        job["template"]["metadata"] = {"labels": {ANCESTOR_LABEL: ANCESTOR_TRAINER}}
        job["dependsOn"] = [{"name": NODE, "status": "Ready"}]
    return job


def spec_digest(spec: dict[str, Any]) -> str:
    """The sha256 of a runtime spec's canonical JSON."""
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()


def build_runtime(p: ClusterJobParams, namespace: str | None = None) -> dict[str, Any]:
    """The project's TrainingRuntime for `p` (the MPI policy, the JobSet of nodes and launcher),
    named ``kfp-horovod-<hash of its spec>``."""
    spec = {
        "mlPolicy": {
            "numNodes": 1,  # the launcher's count; the TrainJob's numNodes sizes the nodes
            "mpi": {
                "numProcPerNode": 1,
                "mpiImplementation": "OpenMPI",
                "sshAuthMountPath": defaults.MPI_SSH_AUTH_MOUNT_PATH,
                "runLauncherAsNode": True,
            },
        },
        "template": {
            "spec": {
                "network": {"publishNotReadyAddresses": True},
                "successPolicy": {"operator": "All", "targetReplicatedJobs": [LAUNCHER]},
                "failurePolicy": {"maxRestarts": p.step.backoff_limit},
                "ttlSecondsAfterFinished": p.step.ttl_seconds_after_finished,
                "replicatedJobs": [
                    _replicated_job(NODE, pods.sshd_container(NODE, p.image), p),
                    _replicated_job(LAUNCHER, pods.container(NODE, p.image), p),
                ],
            }
        },
    }
    digest = spec_digest(spec)
    metadata: dict[str, Any] = {
        "name": f"{defaults.TRAINING_RUNTIME_PREFIX}-{digest[:10]}",
        "labels": {**APP_LABELS, "trainer.kubeflow.org/framework": "horovod"},
        "annotations": {SPEC_ANNOTATION: digest},
    }
    if namespace:
        metadata["namespace"] = namespace
    return {
        "apiVersion": TRAINING_RUNTIME.api_version,
        "kind": "TrainingRuntime",
        "metadata": metadata,
        "spec": spec,
    }


def build_manifests(p: ClusterJobParams, namespace: str | None = None) -> list[dict[str, Any]]:
    """``[TrainingRuntime, TrainJob]`` for `p`: `p.train.workers` nodes of `slots_per_worker`
    processes, node 0 running the launcher's command; ValueError names what a TrainJob cannot
    do."""
    elastic = elastic_backend_problem("trainjob", p.train.min_workers)
    fields = TrainStep.__dataclass_fields__
    problems = [elastic] if elastic else []
    problems += [
        f"{name} {why}"
        for name, why in REFUSED.items()
        if getattr(p.step, name) != fields[name].default
    ]
    if problems:
        raise InputError("invalid TrainJob parameters: " + "; ".join(problems))
    runtime = build_runtime(p, namespace)
    trainjob = {
        "apiVersion": TRAINJOB.api_version,
        "kind": TRAINJOB.kind,
        "metadata": job_metadata(p, namespace),
        "spec": {
            "runtimeRef": {
                "name": runtime["metadata"]["name"],
                "apiGroup": API_GROUP,
                "kind": "TrainingRuntime",
            },
            "activeDeadlineSeconds": p.step.active_deadline_seconds,
            "trainer": {
                "image": p.image,
                "command": pods.launcher_command(p),
                "numNodes": p.train.workers,
                "numProcPerNode": p.train.slots_per_worker,
                "resourcesPerNode": pods.worker_resources(p),
                "env": pods.launcher_env(p),
            },
        },
    }
    return [runtime, trainjob]


# A TrainJob's conditions (trainjob_types.go): Suspended while it is, then Complete or Failed.
JOB_KIND = ClusterJobKind(
    name="trainjob",
    crd=TRAINJOB,
    shared=(TRAINING_RUNTIME,),
    build=build_manifests,
    problems=env_problems,
    terminal={"Failed": "Failed", "Complete": "Succeeded"},
    pod_label=JOBSET_NAME_LABEL,
    launcher_label=(REPLICATED_JOB_LABEL, LAUNCHER),
    launcher_container=NODE,
    install=f"install Kubeflow Trainer {defaults.TRAINER_VERSION} (its CRDs, controller and "
    "JobSet; docs/cluster.md), or choose training_backend=mpijob on a cluster with mpi-operator",
    deadline=("spec", "activeDeadlineSeconds"),
    deadline_since="Kubeflow Trainer v2.2.0 (kubeflow/trainer#3258)",  # 26.03 ships v2.1.0
    refused=REFUSED,
)
