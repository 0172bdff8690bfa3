"""TensorBoard: rank 0's per-epoch scalars, and evaluation's test metrics, under one log dir.

The event files are written with ``tf.summary`` into a local folder and copied to the log
directory after every epoch, so the same code serves a local path and ``gs://`` (TensorBoard
reads both). Layout: ``<log dir>/train`` (the trainer's epochs) and ``<log dir>/evaluation``
(the exported model's test metrics, at the last epoch's step).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from components.common import storage


class Board:
    """One TensorBoard run (``name``) of the log directory `uri`, written through `workdir`."""

    def __init__(self, tf: Any, uri: str, name: str, workdir: Path) -> None:
        self.tf, self.uri, self.name = tf, uri, name
        self.local = workdir / "tensorboard"
        self.writer = tf.summary.create_file_writer(str(self.local / name))

    def write(self, step: int, scalars: dict[str, float]) -> None:
        """Write `scalars` at `step`, then copy the event files to the log directory."""
        with self.writer.as_default():
            for tag, value in sorted(scalars.items()):
                self.tf.summary.scalar(tag, float(value), step=step)
        self.writer.flush()
        for path in sorted((self.local / self.name).rglob("*")):
            if path.is_file():
                rel = path.relative_to(self.local).as_posix()
                storage.write_bytes(storage.join(self.uri, rel), path.read_bytes())
