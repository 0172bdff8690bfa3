"""What the cluster backends' lifecycle tests share: a 2 x 2 run's parameters and the outputs
its rank 0 would leave behind (`standins.kmock_jobs.write_rank0_outputs`)."""

from __future__ import annotations

from typing import Any

from components.train.cluster.params import ClusterJobParams
from components.train.config import TrainConfig
from standins.kmock_jobs import write_rank0_outputs

POLL = 0.05  # seconds between the lifecycle's polls


def make_params(bucket: str, **overrides: Any) -> ClusterJobParams:
    """A 2 x 2 run; `overrides` may name TrainConfig or ClusterJobParams fields."""
    train: dict[str, Any] = {
        "data": f"{bucket}/data", "output": f"{bucket}/runs/nightly", "workers": 2,
        "slots_per_worker": 2,
    }  # fmt: skip
    pods: dict[str, Any] = {"run_name": "nightly", "pipeline_run_id": "run-123"}
    for name, value in overrides.items():
        (train if name in TrainConfig.__dataclass_fields__ else pods)[name] = value
    return ClusterJobParams(train=TrainConfig(**train), **pods)


def write_outputs(p: ClusterJobParams, world_size: int | None = None) -> None:
    """What rank 0 of the trainer leaves behind on success (of `world_size` ranks)."""
    write_rank0_outputs(p.train, world_size)
