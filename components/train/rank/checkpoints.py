"""Per-epoch checkpoints, to a local path or gs://: written by rank 0, read by every rank that
resumes (`latest`, `restore`). Runs in each rank.
"""

from __future__ import annotations

import json
import logging
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from components.common import storage
from components.common.failure import InputError

# Layout: ``epoch-0003/ckpt.*`` (the ``tf.train.Checkpoint``), ``epoch-0003/checkpoint.json``
# (epoch, prefix, metrics, model, the Keras major version, and each file's bytes and sha256),
# written after the other files, and ``latest.json`` (the same without the files) after the whole
# epoch directory: a run killed mid-write resumes from the previous complete checkpoint. The last
# `KEEP` are kept.
#
# `latest` checks the epoch ``latest.json`` names and the older ones, newest first, against their
# own ``checkpoint.json``; one log line says which were passed over and why. Once anything was
# committed, a resume never silently starts from scratch: no checkpoint that checks out is a
# `CheckpointError` naming each one.
LATEST = "latest.json"
EPOCH_MARKER = "checkpoint.json"
KEEP = 2
# The Keras that wrote a checkpoint: its object graph is Keras 3's. The tf-keras (Keras 2)
# trainer wrote no such field; its checkpoints are refused by name, never half-restored.
KERAS_MAJOR = 3
_EPOCH_DIR = re.compile(r"^epoch-(\d{4,})$")
_log = logging.getLogger(__name__)


class CheckpointError(InputError):
    """Checkpoints were committed but none can be resumed from; the message names each."""


@dataclass(frozen=True)
class CheckpointInfo:
    """A complete checkpoint: the number of finished epochs, their metrics, the model."""

    epoch: int
    prefix: str
    metrics: dict[str, float]
    model: str
    keras: int = KERAS_MAJOR

    @classmethod
    def of(cls, raw: Any) -> CheckpointInfo:
        """From a parsed marker; raises KeyError, TypeError or ValueError."""
        return cls(
            int(raw["epoch"]),
            str(raw["prefix"]),
            dict(raw.get("metrics", {})),
            str(raw["model"]),
            int(raw.get("keras", 2)),
        )

    def resume_problem(self, model: str, checkpoint_uri: str) -> str | None:
        """Why a run training `model` cannot resume from this checkpoint, or None."""
        if self.keras != KERAS_MAJOR:
            return (
                f"the checkpoints at {checkpoint_uri} were written by the tf-keras (Keras "
                f"{self.keras}) trainer, whose checkpoints Keras {KERAS_MAJOR} cannot restore: "
                "start the run in a fresh output (or checkpoint) directory"
            )
        if self.model == model:
            return None
        return (
            f"the checkpoints at {checkpoint_uri} were written training model {self.model!r}, "
            f"and this run trains {model!r}: resume with model={self.model!r}, or start the "
            "run in a fresh output (or checkpoint) directory"
        )


def epoch_dir(epoch: int) -> str:
    return f"epoch-{epoch:04d}"


def _read_marker(uri: str) -> tuple[Any, str | None]:
    """``(parsed JSON, None)``, or ``(None, why not)``."""
    try:
        return json.loads(storage.read_text(uri)), None
    except FileNotFoundError:
        return None, "missing"
    except ValueError as exc:  # UnicodeDecodeError is a ValueError
        return None, f"unreadable: {exc}"


def _check_epoch(checkpoint_uri: str, epoch: int, present: set[str]) -> CheckpointInfo | str:
    """The checkpoint after `epoch` epochs if it is complete and intact, else why it is not."""
    folder = epoch_dir(epoch)
    if f"{folder}/{EPOCH_MARKER}" not in present:
        inside = any(f.startswith(folder + "/") for f in present)
        return f"no {EPOCH_MARKER}: incomplete" if inside else "its directory is missing"
    raw, problem = _read_marker(storage.join(checkpoint_uri, folder, EPOCH_MARKER))
    if problem is not None:
        return problem
    try:
        files = raw["files"]
        if not isinstance(files, dict) or not files:
            raise TypeError("its marker lists no files")
        for name, want in sorted(files.items()):
            if f"{folder}/{name}" not in present:
                return f"{name} is missing"
            data = storage.read_bytes(storage.join(checkpoint_uri, folder, name))
            if len(data) != int(want["bytes"]):
                return f"{name} has {len(data)} bytes, {int(want['bytes'])} were written"
            if storage.sha256_bytes(data) != want["sha256"]:
                return f"{name} does not match the sha256 recorded when it was written"
        info = CheckpointInfo.of(raw)
    except (KeyError, TypeError, ValueError) as exc:
        return f"{EPOCH_MARKER} is malformed ({exc})"
    return info if info.epoch == epoch else f"its {EPOCH_MARKER} says epoch {info.epoch}"


def latest(checkpoint_uri: str, log: logging.Logger | None = None) -> CheckpointInfo | None:
    """The newest usable checkpoint under `checkpoint_uri`, or None for a fresh start (see the
    module doc). `log` (default: this module's) gets the line naming what was passed over."""
    present = set(storage.relative_files(checkpoint_uri))
    epochs = {int(m[1]) for m in map(_EPOCH_DIR.match, {f.split("/")[0] for f in present}) if m}
    raw, pointer_problem = _read_marker(storage.join(checkpoint_uri, LATEST))
    pointer = None
    if pointer_problem is None:
        try:
            pointer = CheckpointInfo.of(raw)
        except (KeyError, TypeError, ValueError) as exc:
            pointer_problem = f"unreadable: {exc}"
    if pointer_problem == "missing" and not any(
        f"{epoch_dir(e)}/{EPOCH_MARKER}" in present for e in epochs
    ):
        return None  # nothing was committed: a fresh start
    newest = pointer.epoch if pointer is not None else max(epochs, default=0)
    candidates = {e for e in epochs if e <= newest} | ({newest} if newest > 0 else set())
    passed_over = [] if pointer_problem is None else [f"{LATEST} is {pointer_problem}"]
    for epoch in sorted(candidates, reverse=True):
        found = _check_epoch(checkpoint_uri, epoch, present)
        if isinstance(found, CheckpointInfo):
            if passed_over:
                (log or _log).warning("%s; resuming from epoch %d", "; ".join(passed_over), epoch)
            return found
        passed_over.append(f"checkpoint after epoch {epoch} is unreadable ({found})")
    raise CheckpointError(
        f"checkpoints were written to {checkpoint_uri}, but none can be resumed from: "
        f"{'; '.join(passed_over) or 'no checkpoint directory'}. Not starting from scratch: "
        "restore the checkpoints, or start the run in a fresh output (or checkpoint) directory"
    )


def save(
    checkpoint: Any, checkpoint_uri: str, epoch: int, metrics: dict[str, float], model: str
) -> None:
    """Write `checkpoint` (a ``tf.train.Checkpoint``) as the state after `epoch` finished epochs
    of training `model`: its files, its ``checkpoint.json`` last, then ``latest.json``."""
    name = epoch_dir(epoch)
    marker = {
        "epoch": epoch,
        "prefix": f"{name}/ckpt",
        "metrics": metrics,
        "model": model,
        "keras": KERAS_MAJOR,
    }
    with tempfile.TemporaryDirectory(prefix="ckpt-") as tmp:
        checkpoint.write(str(Path(tmp) / "ckpt"))
        files = {
            f.name: {
                "bytes": f.stat().st_size,
                "sha256": storage.sha256_bytes(f.read_bytes()),
            }
            for f in sorted(Path(tmp).iterdir())
        }
        (Path(tmp) / EPOCH_MARKER).write_text(json.dumps({**marker, "files": files}))
        target = storage.join(checkpoint_uri, name)
        storage.remove_tree(target)  # a leftover from a run killed while writing this epoch
        storage.upload_dir(tmp, target, last=EPOCH_MARKER)
    storage.write_text(storage.join(checkpoint_uri, LATEST), json.dumps(marker, sort_keys=True))
    for old in range(epoch - KEEP, 0, -1):
        old_uri = storage.join(checkpoint_uri, epoch_dir(old))
        if not storage.list_files(old_uri) and not storage.exists(old_uri):
            break
        storage.remove_tree(old_uri, last=EPOCH_MARKER)


def restore(checkpoint: Any, checkpoint_uri: str, info: CheckpointInfo, workdir: Path) -> None:
    """Load `info`'s checkpoint into `checkpoint` (any rank), through `workdir`: every value it
    holds, into a model and optimizer built already (else an AssertionError: never a part)."""
    folder = info.prefix.rsplit("/", 1)[0]
    local = storage.download_dir(storage.join(checkpoint_uri, folder), workdir / folder)
    try:
        checkpoint.read(str(local / "ckpt")).assert_consumed()
    except AssertionError as exc:  # TF says which values found no variable, or the reverse
        raise CheckpointError(
            f"the checkpoint after epoch {info.epoch} at {checkpoint_uri} does not fit the "
            f"model and optimizer of this run ({str(exc).splitlines()[0][:200]}); start the run "
            "in a fresh output (or checkpoint) directory"
        ) from exc
