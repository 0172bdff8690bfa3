"""The train step's own parameters, declared once as `TrainConfig`'s are: where and how the
Horovod job runs (the nodes its pods run on: `components.common.placement.Placement`). The
pipeline exposes the first ones (`TrainStep.parameters(pipeline_only=True)`); the job's own
settings after them keep their defaults in a pipeline run and are options of the render
commands.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from components.common import defaults
from components.common.declare import Validated, param
from components.common.placement import DNS_SUBDOMAIN

TRAINING_BACKENDS = ("auto", "local", "mpijob", "trainjob")


def elastic_backend_problem(backend: str, min_workers: int | None) -> str | None:
    """Why an elastic job cannot run on `backend`: Kubeflow Trainer v2 has no host discovery."""
    if backend != "trainjob" or not min_workers:
        return None
    return (
        f"min_workers={min_workers}: elastic training needs mpi-operator's discover_hosts.sh, "
        "which Kubeflow Trainer v2 does not provide; use training_backend 'mpijob' (or "
        "min_workers 0) instead of 'trainjob'"
    )


def dns_name_problem(value: str | None) -> str | None:
    """Why `value` is not a lower-case DNS name (None or empty: not set), or None."""
    if not value or DNS_SUBDOMAIN.match(value):
        return None
    return f"must be a lower-case DNS name, got {value!r}"


def image_problem(value: str) -> str | None:
    """Why `value` is not an image reference (empty: the default image), or None."""
    if not any(c.isspace() for c in value):
        return None
    return f"must be an image reference without spaces, got {value!r}"


@dataclass(frozen=True)
class TrainStep(Validated):
    """How the train step runs the job: its backend, image, pods, identity and run policy."""

    @staticmethod
    def joint_problems(values: Mapping[str, Any]) -> list[str]:
        min_workers = values.get("min_workers")
        problem = elastic_backend_problem(values.get("training_backend", ""), min_workers)
        return [problem] if problem else []

    training_backend: str = param(
        "auto",
        "auto: the job operator the cluster serves (an MPIJob where mpi-operator is "
        "installed, else a TrainJob on Kubeflow Trainer v2); mpijob: a Kubeflow MPIJob across "
        "pods (mpi-operator); trainjob: a Kubeflow Trainer v2 TrainJob across pods; local: "
        "mpirun inside the train step's own pod",
        choices=TRAINING_BACKENDS,
    )
    trainer_image: str = param(
        "",
        "the trainer's image; empty: this version's trainer image, the GPU one when "
        "gpus_per_worker > 0",
        check=image_problem,
    )
    # resources of each worker pod (requests == limits: Guaranteed QoS)
    cpu_per_worker: str = param(defaults.WORKER_CPU, "CPU of each worker pod", quantity=True)
    memory_per_worker: str = param(
        defaults.WORKER_MEMORY, "memory of each worker pod", quantity=True
    )
    namespace: str = param("", "the cluster job's namespace; empty: the train step's own")
    trainer_service_account: str = param(
        defaults.TRAINER_SERVICE_ACCOUNT,
        "the service account of the job's pods (Workload Identity)",
        check=dns_name_problem,
    )
    # the job's own settings, at their defaults in a pipeline run
    stall_shutdown_seconds: int = param(
        defaults.STALL_SHUTDOWN_SECONDS,
        "how long a rank may stall (or stay silent) before the job ends",
        pipeline=False,
        minimum=1,
    )
    launcher_cpu: str = param(
        defaults.LAUNCHER_CPU,
        "CPU of the launcher pod (MPIJob only)",
        pipeline=False,
        quantity=True,
    )
    launcher_memory: str = param(
        defaults.LAUNCHER_MEMORY,
        "memory of the launcher pod (MPIJob only)",
        pipeline=False,
        quantity=True,
    )
    ttl_seconds_after_finished: int = param(
        defaults.JOB_TTL_SECONDS_AFTER_FINISHED,
        "seconds a finished job is kept",
        pipeline=False,
        minimum=0,
    )
    backoff_limit: int = param(
        defaults.JOB_BACKOFF_LIMIT, "launcher retries", pipeline=False, minimum=0
    )
    active_deadline_seconds: int = param(
        defaults.JOB_ACTIVE_DEADLINE_SECONDS, "the job's deadline", pipeline=False, minimum=1
    )
    # gang scheduling (Volcano / scheduler-plugins); all optional
    queue: str | None = param(
        None,
        "gang-scheduling queue (Volcano; MPIJob only)",
        pipeline=False,
        check=dns_name_problem,
    )
    priority_class: str | None = param(
        None, "priority class of the pods", pipeline=False, check=dns_name_problem
    )
    min_available: int | None = param(
        None, "gang size (MPIJob only; default: all pods)", pipeline=False, minimum=1
    )
    scheduler_name: str | None = param(None, "e.g. volcano", pipeline=False, check=dns_name_problem)
