"""The registration the registry's tests run: ``register`` of a trained model at a fixed time."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from components.register import register as rg

FIXED_TIME = datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone.utc)


def register_run(trained_model: Any, summary: str, root: str, run_id: str, accuracy: float) -> Any:
    """Register `trained_model` under `root` as run `run_id` with test accuracy `accuracy`."""
    return rg.register(
        trained_model.path, summary, trained_model.dataset, accuracy, 0.3,
        registry_root=root, pipeline_run_id=run_id, min_accuracy=0.5, now=lambda: FIXED_TIME,
    )  # fmt: skip
