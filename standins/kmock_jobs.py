"""The jobs `standins.kmock_cluster`'s operators play: what a controller makes of each kind of
job on the API (`Kind`), the launcher's command read back from a stored job, and a placeholder
for rank 0's outputs where a test trains nothing (it claims no training outcome).

* `MPIJOB_KIND`, mpi-operator: conditions Created, Running, then Succeeded or Failed; pods
  ``<name>-launcher-xxxxx`` and ``<name>-worker-<i>`` with the manifest's own labels.
* `TRAINJOB_KIND`, a stand-in for Kubeflow Trainer v2.3 and the JobSet controller under it
  (read from kubeflow/trainer at v2.3.0: ``pkg/apis/trainer/v1alpha1/trainjob_types.go``,
  ``pkg/runtime/framework/plugins/jobset/jobset.go``): Trainer sets no condition while a
  TrainJob runs (it has no Created or Running) and copies JobSet's terminal condition as
  ``Complete`` or ``Failed`` (JobSet's reasons); JobSet names the pods of replicated job
  ``<r>`` ``<name>-<r>-<job index>-<completion index>-xxxxx`` and labels them with the JobSet's
  and the replicated job's names. The launcher job has one pod; the node job as many as
  the TrainJob's ``numNodes``, less one when its TrainingRuntime runs the launcher as node 0.
  That runtime must exist, as Trainer needs it to build the JobSet.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from components.common import storage
from components.common.crd import Crd
from components.train import summary
from components.train.config import TrainConfig, adam_settings
from components.train.launcher.cluster.job import LABEL_ROLE
from components.train.launcher.cluster.mpijob import LABEL_JOB, MPIJOB
from components.train.launcher.cluster.trainjob import (
    JOBSET_NAME_LABEL,
    LAUNCHER,
    NODE,
    REPLICATED_JOB_LABEL,
    TRAINING_RUNTIME,
    TRAINJOB,
)

JOB_INDEX_LABEL = "jobset.sigs.k8s.io/job-index"
COMPLETION_INDEX_LABEL = "batch.kubernetes.io/job-completion-index"

Condition = tuple[str, str, str]  # (type, reason, message) of a condition whose status is True
# (name, labels, container, the pod template's spec the controller makes the pod from)
PodSpec = tuple[str, dict[str, str], str, dict[str, Any]]
Lookup = Callable[[str, Crd], "dict[str, Any] | None"]  # a stored object by name and kind


def _suffix() -> str:
    """The 5 random characters a controller's pod name ends with (Kubernetes' alphabet)."""
    return "".join(random.choices("bcdfghjklmnpqrstvwxz2456789", k=5))


@dataclass(frozen=True)
class Kind:
    """How a job of one kind shows on the API while its controller runs it: its resource, the
    conditions set as it starts (`running`, in order) and ends, its pods (`pods`: stored
    objects' lookup and the stored job -> ``[(name, labels, container, template spec)]``, the
    launcher first), where the stored job keeps the launcher's command and environment, and the
    ``status.jobsStatus`` its controller reports once the pods run (`jobs_status`, if any)."""

    crd: Crd
    running: tuple[Condition, ...]
    succeeded: Condition
    failed: Callable[[int], Condition]
    pods: Callable[[Lookup, dict[str, Any]], list[PodSpec]]
    launcher: Callable[[dict[str, Any]], tuple[list[str], dict[str, str]]]
    jobs_status: Callable[[list[PodSpec]], list[dict[str, Any]]] | None = None


def _mpijob_pods(lookup: Lookup, job: dict[str, Any]) -> list[PodSpec]:
    name, replicas = job["metadata"]["name"], job["spec"]["mpiReplicaSpecs"]
    workers = int(replicas["Worker"]["replicas"])
    launcher = (f"{name}-launcher-{_suffix()}", {LABEL_JOB: name, LABEL_ROLE: "launcher"})
    worker = {LABEL_JOB: name, LABEL_ROLE: "worker"}
    worker_spec = replicas["Worker"]["template"]["spec"]
    return [
        (*launcher, "launcher", replicas["Launcher"]["template"]["spec"]),
        *((f"{name}-worker-{i}", worker, "worker", worker_spec) for i in range(workers)),
    ]


def _mpijob_launcher(job: dict[str, Any]) -> tuple[list[str], dict[str, str]]:
    """The launcher container's command and environment in a stored MPIJob."""
    container = job["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0]
    return list(container["command"]), {e["name"]: e["value"] for e in container.get("env", [])}


MPIJOB_KIND = Kind(
    MPIJOB,
    running=(("Created", "MPIJobCreated", "MPIJob created"),
             ("Running", "MPIJobRunning", "launcher is running")),
    succeeded=("Succeeded", "MPIJobSucceeded", "MPIJob successfully completed."),
    failed=lambda code: ("Failed", "Error", f"exit {code}"),
    pods=_mpijob_pods,
    launcher=_mpijob_launcher,
)  # fmt: skip


def _trainjob_pods(lookup: Lookup, job: dict[str, Any]) -> list[PodSpec]:
    """JobSet's pods of a TrainJob: the launcher job's one pod, then the node job's."""
    name, trainer = job["metadata"]["name"], job["spec"]["trainer"]
    ref = job["spec"]["runtimeRef"]["name"]
    runtime = lookup(ref, TRAINING_RUNTIME)
    assert runtime is not None, f"TrainJob {name}: its TrainingRuntime {ref} does not exist"
    as_node = runtime["spec"]["mlPolicy"]["mpi"].get("runLauncherAsNode", False)
    nodes = int(trainer.get("numNodes", 1)) - (1 if as_node else 0)
    specs = {
        r["name"]: r["template"]["spec"]["template"]["spec"]
        for r in runtime["spec"]["template"]["spec"]["replicatedJobs"]
    }

    def labels(replicated_job: str, index: int) -> dict[str, str]:
        return {
            JOBSET_NAME_LABEL: name, REPLICATED_JOB_LABEL: replicated_job, JOB_INDEX_LABEL: "0",
            COMPLETION_INDEX_LABEL: str(index),
        }  # fmt: skip

    return [
        (f"{name}-{LAUNCHER}-0-0-{_suffix()}", labels(LAUNCHER, 0), NODE, specs[LAUNCHER]),
        *(
            (f"{name}-{NODE}-0-{i}-{_suffix()}", labels(NODE, i), NODE, specs[NODE])
            for i in range(nodes)
        ),
    ]


def _trainjob_jobs_status(pods: list[PodSpec]) -> list[dict[str, Any]]:
    """Trainer's ``status.jobsStatus`` (the JobSet's replicated jobs' counts) with every pod
    running and ready."""
    counts: dict[str, int] = {}
    for _, labels, _, _ in pods:
        counts[labels[REPLICATED_JOB_LABEL]] = counts.get(labels[REPLICATED_JOB_LABEL], 0) + 1
    return [
        {"name": name, "ready": n, "active": n, "succeeded": 0, "failed": 0, "suspended": 0}
        for name, n in counts.items()
    ]


def _trainjob_launcher(job: dict[str, Any]) -> tuple[list[str], dict[str, str]]:
    trainer = job["spec"]["trainer"]
    return list(trainer["command"]), {e["name"]: e["value"] for e in trainer.get("env", [])}


# JobSet's terminal conditions (sigs.k8s.io/jobset pkg/constants), as Trainer copies them.
TRAINJOB_KIND = Kind(
    TRAINJOB,
    running=(),
    succeeded=("Complete", "AllJobsCompleted", "jobset completed successfully"),
    failed=lambda code: ("Failed", "FailedJobs", "jobset failed due to one or more job failures"),
    pods=_trainjob_pods,
    launcher=_trainjob_launcher,
    jobs_status=_trainjob_jobs_status,
)


def local_equivalent(command: list[str]) -> tuple[int, list[str], dict[str, str]]:
    """``[mpiwatch ... --] mpirun -np N ... -x K=V ... python -m components.train.rank ARGS`` as
    ``(N, ARGS, {K: V})``. The heartbeat period is left out: the heartbeat watch
    (`components.train.launcher.mpiwatch`) is not run here, so nothing would take the beats out."""
    from components.train.rank.heartbeat import HEARTBEAT_ENV

    command = command[command.index("mpirun") :]
    exported = [command[i + 1] for i, word in enumerate(command[:-1]) if word == "-x"]
    module = command.index("components.train.rank")
    env = dict(item.split("=", 1) for item in exported if "=" in item)
    env.pop(HEARTBEAT_ENV, None)
    return int(command[command.index("-np") + 1]), command[module + 1 :], env


def write_rank0_outputs(train: TrainConfig, world_size: int | None = None) -> None:
    """A placeholder for what rank 0 leaves behind on success, at `train`'s URIs, for tests
    of a job's lifecycle that train nothing: a stand-in ``saved_model.pb`` and a run summary
    holding only what the operator knows (the world size it ran, `world_size` or the job's,
    the config the command says, and the Adam settings the trainer's rule gives them). It
    claims no training outcome: no rank records, weights not shown identical, no metrics,
    nothing covered. A test that needs an outcome runs the
    real trainer (`standins.kmock_cluster.TrainerOperator`)."""
    size = train.world_size if world_size is None else world_size
    model = b"placeholder: no model was trained"
    storage.write_bytes(storage.join(train.model_uri, "saved_model.pb"), model)
    summary.write(train.summary_uri, summary.RunSummary(
        config=train, world_size=size, hosts=[], controller="mpi", gradient_allreduce="host",
        resumed_from_epoch=0, adam=adam_settings(train.lr_scaling, train.learning_rate, size),
        model_parameters=0, dataset={}, per_rank=[],
        coverage={"samples": 0, "seen_per_epoch": 0, "disjoint": False, "covers_all": False},
        weights_identical_across_ranks=False, final_metrics={},
        saved_model_sha256=hashlib.sha256(model).hexdigest(),
    ))  # fmt: skip
