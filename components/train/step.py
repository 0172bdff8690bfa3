"""The train step's own parameters: where and how the Horovod job runs (the trainer's are
`TrainConfig`'s), declared once, as `TrainConfig`'s are."""

from __future__ import annotations

from dataclasses import dataclass

from components.common import defaults
from components.common.declare import Declared, declared, param
from components.common.params import TRAINING_BACKENDS, Validated
from components.common.placement import (
    NODE_SELECTOR_HELP,
    TOLERATIONS_HELP,
    node_selector_problem,
    tolerations_problem,
)


@dataclass(frozen=True)
class TrainStep(Validated):
    """How the train step runs the job: its backend, image, pods and identity."""

    training_backend: str = param(
        "auto", "auto: the job operator the cluster serves (an MPIJob where mpi-operator is "
        "installed, else a TrainJob on Kubeflow Trainer v2); mpijob: a Kubeflow MPIJob across "
        "pods (mpi-operator); trainjob: a Kubeflow Trainer v2 TrainJob across pods; local: "
        "mpirun inside the train step's own pod",
        choices=TRAINING_BACKENDS,
    )  # fmt: skip
    trainer_image: str = param(
        "", "the trainer's image; empty: this version's trainer image, the GPU one when "
        "gpus_per_worker > 0",
    )  # fmt: skip
    cpu_per_worker: str = param(defaults.WORKER_CPU, "CPU of each worker pod", quantity=True)
    memory_per_worker: str = param(
        defaults.WORKER_MEMORY, "memory of each worker pod", quantity=True
    )
    namespace: str = param("", "the cluster job's namespace; empty: the train step's own")
    trainer_service_account: str = param(
        defaults.TRAINER_SERVICE_ACCOUNT, "the service account of the job's pods (Workload "
        "Identity)",
    )  # fmt: skip
    node_selector: str = param("{}", NODE_SELECTOR_HELP, check=node_selector_problem)
    tolerations: str = param("[]", TOLERATIONS_HELP, check=tolerations_problem)


TRAIN_STEP_PARAMETERS: list[Declared] = declared(TrainStep)
