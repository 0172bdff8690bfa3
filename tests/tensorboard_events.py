"""Reading TensorBoard event files back, with TensorBoard's own reader (a test helper)."""

from __future__ import annotations

from pathlib import Path


def read_scalars(log_dir: str | Path) -> dict[str, dict[str, list[tuple[int, float]]]]:
    """Every scalar of the event files under `log_dir`: run -> tag -> [(step, value)], as
    TensorBoard shows them."""
    from tensorboard.backend.event_processing.event_accumulator import TENSORS, EventAccumulator
    from tensorboard.util.tensor_util import make_ndarray

    runs: dict[str, dict[str, list[tuple[int, float]]]] = {}
    for run_dir in sorted(p for p in Path(log_dir).iterdir() if p.is_dir()):
        events = EventAccumulator(str(run_dir), size_guidance={TENSORS: 0})
        events.Reload()
        runs[run_dir.name] = {
            tag: [(e.step, float(make_ndarray(e.tensor_proto))) for e in events.Tensors(tag)]
            for tag in events.Tags()["tensors"]
        }
    return runs
