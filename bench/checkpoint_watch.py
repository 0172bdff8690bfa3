"""Follow the trainer's per-epoch checkpoints while it runs; score them on the test split later.

The trainer keeps only its last two checkpoints, so a watcher thread copies each one as its
``latest.json`` appears and records when that happened (the file's modification time). After
the run, every copied epoch is restored into the project's model and scored on the test split.
"""

from __future__ import annotations

import json
import shutil
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np


@dataclass
class EpochMark:
    """One finished epoch: when its checkpoint was complete, and where the copy is."""

    epoch: int
    wall_time: float
    copy: Path


@dataclass
class CheckpointWatcher:
    """Polls ``checkpoint_dir/latest.json`` in a thread and copies every new epoch."""

    checkpoint_dir: Path
    keep_dir: Path
    poll_seconds: float = 0.02
    marks: list[EpochMark] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def start(self) -> CheckpointWatcher:
        """Start watching."""
        self._thread.start()
        return self

    def stop(self) -> list[EpochMark]:
        """Take a last look, stop, and return the epochs seen, in order."""
        self._stop.set()
        self._thread.join()
        self._poll()
        return sorted(self.marks, key=lambda m: m.epoch)

    def _loop(self) -> None:
        while not self._stop.wait(self.poll_seconds):
            self._poll()

    def _poll(self) -> None:
        marker = self.checkpoint_dir / "latest.json"
        try:
            mtime = marker.stat().st_mtime
            info = json.loads(marker.read_text())
        except (OSError, ValueError):
            return
        epoch = int(info["epoch"])
        if any(m.epoch == epoch for m in self.marks):
            return
        folder = self.checkpoint_dir / info["prefix"].split("/")[0]
        copy = self.keep_dir / folder.name
        try:
            shutil.copytree(folder, copy, dirs_exist_ok=True)
        except OSError:
            return  # half-replaced by the next epoch: caught on the next poll or missed
        self.marks.append(EpochMark(epoch, mtime, copy))


def score_checkpoints(
    marks: list[EpochMark], data: str, seed: int = 42, model_name: str | None = None
) -> list[tuple[int, float, float]]:
    """``(epoch, wall_time, test_accuracy)`` for every copied checkpoint of `model_name`
    (None: the trainer's default model)."""
    from bench.common import build_bench_model
    from components.common import dataset, keras_env

    tf = keras_env.tensorflow()
    images, labels = dataset.load_split(data, "test")
    model = build_bench_model(model_name, seed)
    scored = []
    for mark in marks:
        tf.train.Checkpoint(model=model).read(str(mark.copy / "ckpt")).expect_partial()
        probabilities = model.predict(images, batch_size=500, verbose=0)
        accuracy = float(np.mean(np.argmax(probabilities, axis=1) == labels))
        scored.append((mark.epoch, mark.wall_time, round(accuracy, 4)))
    return scored


def first_reaching(scored: list[tuple[int, float, float]], target: float) -> dict[str, Any] | None:
    """The first scored epoch whose test accuracy is at least `target`, or None."""
    for epoch, wall_time, accuracy in scored:
        if accuracy >= target:
            return {"epoch": epoch, "wall_time": wall_time, "accuracy": accuracy}
    return None


def wait_for(path: Path, timeout_s: float) -> bool:
    """Wait until `path` exists (True) or `timeout_s` passes (False)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if path.exists():
            return True
        time.sleep(0.05)
    return False
