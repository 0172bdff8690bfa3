"""Reading TensorBoard event files back, with TensorBoard's own reader (a test helper)."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def read_scalars(log_dir: str | Path) -> dict[str, dict[str, list[tuple[int, float]]]]:
    """Every scalar of the event files under `log_dir`: run -> tag -> [(step, value)], read
    with TensorBoard's own event reader (what TensorBoard shows)."""
    from tensorboard.backend.event_processing.event_accumulator import (
        TENSORS,
        EventAccumulator,
    )

    runs: dict[str, dict[str, list[tuple[int, float]]]] = {}
    for run_dir in sorted(p for p in Path(log_dir).iterdir() if p.is_dir()):
        events = EventAccumulator(str(run_dir), size_guidance={TENSORS: 0})
        events.Reload()
        runs[run_dir.name] = {
            tag: [(e.step, float(_value(e.tensor_proto))) for e in events.Tensors(tag)]
            for tag in events.Tags()["tensors"]
        }
    return runs


def _value(tensor: Any) -> float:
    from tensorboard.util import tensor_util

    return float(tensor_util.make_ndarray(tensor))
