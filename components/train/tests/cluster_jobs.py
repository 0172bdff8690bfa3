"""What the cluster backends' tests share: a run's parameters (by field name, whichever part
declares it), both backends to parametrize over, and the outputs rank 0 would leave behind
(`standins.kmock_jobs.write_rank0_outputs`)."""

from __future__ import annotations

from typing import Any

import pytest

from components.train.cluster.job import Backend, ClusterJobParams, backend
from components.train.config import TrainConfig
from components.train.step import TrainStep
from standins.kmock_jobs import MPIJOB_KIND, TRAINJOB_KIND, Kind, write_rank0_outputs

POLL = 0.05  # seconds between the run's polls
KINDS = {"mpijob": MPIJOB_KIND, "trainjob": TRAINJOB_KIND}
BOTH = pytest.mark.parametrize("name", list(KINDS))


def make_params(bucket: str = "gs://bkt", **overrides: Any) -> ClusterJobParams:
    """A 2 x 2 run ``nightly``; `overrides` may name fields of TrainConfig, TrainStep or
    ClusterJobParams."""
    parts: dict[str, dict[str, Any]] = {
        "train": {"data": f"{bucket}/data", "output": f"{bucket}/runs/nightly", "workers": 2,
                  "slots_per_worker": 2},
        "step": {}, "run": {"run_name": "nightly", "pipeline_run_id": "run-123"},
    }  # fmt: skip
    for name, value in overrides.items():
        part = "train" if name in TrainConfig.__dataclass_fields__ else "run"
        parts["step" if name in TrainStep.__dataclass_fields__ else part][name] = value
    return ClusterJobParams(
        train=TrainConfig(**parts["train"]), step=TrainStep(**parts["step"]), **parts["run"]
    )


def pair(name: str) -> tuple[Backend, Kind]:
    """Backend `name` and the stand-in of its operator."""
    return backend(name), KINDS[name]


def write_outputs(p: ClusterJobParams, world_size: int | None = None) -> None:
    """What rank 0 of the trainer leaves behind on success (of `world_size` ranks)."""
    write_rank0_outputs(p.train, world_size)
