"""What a pipeline author sets on the train task with kfp-kubernetes, forwarded to the job's pods.

KFP (>= 2.15) hands a component that declares ``task_config_passthroughs`` a ``dsl.TaskConfig``:
the resources, environment, node selector, tolerations, affinity and volumes set on its task
(pipelines#12185). The train step forwards them to every pod that runs a rank, on both
backends (`PodConfig`, `ClusterJobParams.task_config`), after these rules:

* a key the pipeline's own parameters set too must agree: a ``node_selector`` label, the
  CPU and memory of ``cpu_per_worker`` and ``memory_per_worker`` (a parameter left at its
  default gives way to the task config), the GPUs of ``gpus_per_worker``; otherwise the run is
  refused, naming both;
* tolerations add up (a toleration only permits), each once;
* the environment reaches the ranks (``mpirun -x``), so a name the job sets itself is refused.

Nothing here talks to a cluster or reads the environment.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from components.train.mpiwatch import HEARTBEAT_ENV
from components.train.step import TrainStep

GPU_RESOURCE = "nvidia.com/gpu"
# What the job sets in its ranks' environment itself (`cluster.pods.rank_env`; Open MPI's OMPI_*
# too): unbuffered output, Horovod's stall bound, the heartbeat period.
UNBUFFERED, STALL_BOUND = "PYTHONUNBUFFERED", "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS"
JOB_ENV = ("PATH", UNBUFFERED, STALL_BOUND, HEARTBEAT_ENV)


@dataclass(frozen=True)
class PodConfig:
    """The task config's part that the job's rank pods get (empty: nothing set)."""

    node_selector: dict[str, str] = field(default_factory=dict)
    tolerations: list[dict[str, Any]] = field(default_factory=list)
    affinity: dict[str, Any] = field(default_factory=dict)
    env: list[dict[str, Any]] = field(default_factory=list)
    volumes: list[dict[str, Any]] = field(default_factory=list)
    volume_mounts: list[dict[str, Any]] = field(default_factory=list)


def from_task_config(task_config: Any) -> PodConfig:
    """The `PodConfig` of a ``kfp.dsl.TaskConfig`` (None: nothing passed through)."""
    if task_config is None:
        return PodConfig()
    return PodConfig(
        node_selector=dict(task_config.node_selector or {}),
        tolerations=list(task_config.tolerations or []),
        affinity=dict(task_config.affinity or {}),
        env=list(task_config.env or []),
        volumes=list(task_config.volumes or []),
        volume_mounts=list(task_config.volume_mounts or []),
    )


def node_selector_conflicts(parameter: Mapping[str, str], passed: Mapping[str, str]) -> list[str]:
    """The labels that the ``node_selector`` parameter and the task config set differently."""
    return [
        f"node selector label {key!r}: the node_selector parameter says {parameter[key]!r}, "
        f"the train task's config says {passed[key]!r}"
        for key in sorted(set(parameter) & set(passed))
        if parameter[key] != passed[key]
    ]


def env_conflicts(env: list[dict[str, Any]]) -> list[str]:
    """The task config's environment variables that the job sets itself (`JOB_ENV`)."""
    return [
        f"env {e.get('name')!r} from the train task's config: the job sets it itself"
        for e in env
        if e.get("name") in JOB_ENV or str(e.get("name", "")).startswith("OMPI_")
    ]


def _amount(resources: Mapping[str, Any], name: str) -> str | None:
    """`name`'s limit, else its request, in the task config's resources (None: not set)."""
    for part in ("limits", "requests"):
        value = (resources.get(part) or {}).get(name)
        if value not in (None, ""):
            return str(value)
    return None


def worker_resources(resources: Mapping[str, Any] | None, step: TrainStep, gpus: int) -> TrainStep:
    """`step` with its workers' CPU and memory from the task config's `resources` where its
    parameters are at their defaults (a parameter set otherwise must agree, as must
    `gpus`, the ``gpus_per_worker`` parameter); ValueError names each disagreement."""
    chosen: dict[str, Any] = {}
    problems: list[str] = []
    for name, parameter in (("cpu", "cpu_per_worker"), ("memory", "memory_per_worker")):
        passed, value = _amount(resources or {}, name), getattr(step, parameter)
        if passed is None or passed == str(value):
            continue
        if value != TrainStep.__dataclass_fields__[parameter].default:
            problems.append(
                f"{name}: the {parameter} parameter says {value!r}, the train task's config "
                f"says {passed!r}"
            )
        else:
            chosen[parameter] = passed
    passed_gpus = _amount(resources or {}, GPU_RESOURCE)
    if passed_gpus not in (None, "0") and passed_gpus != str(gpus):
        problems.append(
            f"{GPU_RESOURCE}: the gpus_per_worker parameter says {gpus!r}, the train task's "
            f"config says {passed_gpus!r}"
        )
    if problems:
        raise ValueError(
            "the train task's config and the pipeline's parameters disagree: " + "; ".join(problems)
        )
    return dataclasses.replace(step, **chosen)
