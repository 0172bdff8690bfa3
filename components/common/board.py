"""TensorBoard's log dir: rank 0's per-epoch scalars (run ``train``) and evaluation's test metrics
(run ``evaluation``). Runs in rank 0 of the trainer and in the evaluate step's pod.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from components.common import storage


# Event files are written locally and copied to the log dir after every write, so a local path and
# ``gs://`` work the same. A run has one event file, which grows by about 0.5 KB an epoch and a GCS
# object cannot be appended to, so each copy is the whole file: 4 to 14 ms a write on
# fake-gcs-server at 1 KB and at 100 KB alike. TensorFlow's own ``gs://`` file system would spare
# the copy, but it always calls www.googleapis.com (it ignores ``STORAGE_EMULATOR_HOST``), so no
# test here could run it.
class Board:
    """One TensorBoard run (``name``) of the log directory `uri`, written through `workdir`."""

    def __init__(self, tf: Any, uri: str, name: str, workdir: Path) -> None:
        self.tf, self.uri, self.name = tf, uri, name
        self.local = workdir / "tensorboard"
        self.writer = tf.summary.create_file_writer(str(self.local / name))

    def write(self, step: int, scalars: dict[str, float]) -> None:
        with self.writer.as_default():
            for tag, value in sorted(scalars.items()):
                self.tf.summary.scalar(tag, float(value), step=step)
        self.writer.flush()
        for path in sorted((self.local / self.name).rglob("*")):
            if path.is_file():
                rel = path.relative_to(self.local).as_posix()
                storage.write_bytes(storage.join(self.uri, rel), path.read_bytes())
