"""The registration the register and serve tests run: ``register`` of a trained model at a fixed
time (minimum accuracy 0.5 unless given)."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from components.register import register as rg

FIXED_TIME = datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone.utc)


def register_run(
    model: Any, summary: str, root: str, run_id: str, accuracy: float, loss: float = 0.3, **kw: Any
) -> rg.Decision:
    """Register `model` (a `TrainedModel`) with run summary `summary` under `root` as run
    `run_id` with test `accuracy` and `loss`; `kw` as `register` takes them."""
    kw.setdefault("min_accuracy", 0.5)
    return rg.register(
        model.path,
        summary,
        model.dataset,
        accuracy,
        loss,
        registry_root=root,
        pipeline_run_id=run_id,
        now=lambda: FIXED_TIME,
        **kw,
    )
