"""Per-epoch checkpoints, written by rank 0 only, to a local path or gs://.

Layout under the checkpoint directory::

    epoch-0003/ckpt.index, epoch-0003/ckpt.data-00000-of-00001
    latest.json   {"epoch": 3, "prefix": "epoch-0003/ckpt", "metrics": {...},
                   "model": "mnist_advanced"}

``latest.json`` is written after the files it names, so a run killed mid-write resumes from
the previous complete checkpoint. The last `keep` checkpoints are kept.
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from components.common import storage

LATEST = "latest.json"
# Markers written before the model was a choice name no model: all of them trained this one.
MODEL_BEFORE_THE_CHOICE = "small"


@dataclass(frozen=True)
class CheckpointInfo:
    """The latest complete checkpoint: the number of finished epochs, their metrics, and the
    model that was trained."""

    epoch: int
    prefix: str
    metrics: dict[str, float]
    model: str = MODEL_BEFORE_THE_CHOICE

    def model_problem(self, model: str, checkpoint_uri: str) -> str | None:
        """Why a run training `model` cannot resume from this checkpoint, or None."""
        if self.model == model:
            return None
        return (
            f"the checkpoints at {checkpoint_uri} were written training model {self.model!r}, "
            f"and this run trains {model!r}: resume with model={self.model!r}, or start the "
            "run in a fresh output (or checkpoint) directory"
        )


def latest(checkpoint_uri: str) -> CheckpointInfo | None:
    """The latest complete checkpoint under `checkpoint_uri`, or None for a fresh start."""
    marker = storage.join(checkpoint_uri, LATEST)
    if not storage.exists(marker):
        return None
    try:
        raw = json.loads(storage.read_text(marker))
        return CheckpointInfo(
            int(raw["epoch"]),
            str(raw["prefix"]),
            dict(raw.get("metrics", {})),
            str(raw.get("model", MODEL_BEFORE_THE_CHOICE)),
        )
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"{marker}: unreadable checkpoint marker ({exc})") from exc


def save(
    checkpoint: Any,
    checkpoint_uri: str,
    epoch: int,
    metrics: dict[str, float],
    model: str,
    keep: int = 2,
) -> None:
    """Write `checkpoint` (a ``tf.train.Checkpoint``) as the state after `epoch` finished epochs
    of training `model`."""
    name = f"epoch-{epoch:04d}"
    with tempfile.TemporaryDirectory(prefix="ckpt-") as tmp:
        checkpoint.write(str(Path(tmp) / "ckpt"))
        target = storage.join(checkpoint_uri, name)
        storage.remove_tree(target)  # a leftover from a run killed while writing this epoch
        storage.upload_dir(tmp, target)
    marker = {"epoch": epoch, "prefix": f"{name}/ckpt", "metrics": metrics, "model": model}
    storage.write_text(storage.join(checkpoint_uri, LATEST), json.dumps(marker, sort_keys=True))
    for old in range(epoch - keep, 0, -1):
        old_uri = storage.join(checkpoint_uri, f"epoch-{old:04d}")
        if not storage.list_files(old_uri) and not storage.exists(old_uri):
            break
        storage.remove_tree(old_uri)


def restore(checkpoint: Any, checkpoint_uri: str, info: CheckpointInfo, workdir: Path) -> None:
    """Load the checkpoint described by `info` into `checkpoint` (all ranks may call this).

    The files are copied into `workdir`, which must outlive the first training step: the
    optimizer's slots only exist after it, and TensorFlow restores them then (deferred restore).
    """
    folder = info.prefix.rsplit("/", 1)[0]
    local = storage.download_dir(storage.join(checkpoint_uri, folder), workdir / folder)
    checkpoint.read(str(local / "ckpt")).expect_partial()
