"""Per-epoch checkpoints, written by rank 0 only, to a local path or gs://.

Layout under the checkpoint directory::

    epoch-0003/ckpt.index, epoch-0003/ckpt.data-00000-of-00001
    epoch-0003/checkpoint.json   {"epoch": 3, "prefix": "epoch-0003/ckpt", "metrics": {...},
                                  "model": "mnist_advanced", "files": {name: {bytes, sha256}}}
    latest.json   {"epoch": 3, "prefix": "epoch-0003/ckpt", "metrics": {...}, "model": ...}

Each epoch's ``checkpoint.json`` is written after its other files, and ``latest.json`` after
the whole epoch directory, so a run killed mid-write resumes from the previous complete
checkpoint. The last `keep` checkpoints are kept.

Choosing where to resume (`latest`): ``latest.json`` names the newest committed epoch; that
epoch and the older ones are checked newest first against their own ``checkpoint.json`` (every
file there, with its size and sha256), and the first that checks out is used. When it is not
the one ``latest.json`` names, or ``latest.json`` itself is unreadable or gone, one log line
says which checkpoint was passed over and why. A resume never silently starts from scratch:
once anything was committed (``latest.json`` or an epoch's ``checkpoint.json`` exists) and no
checkpoint checks out, `latest` raises `CheckpointError` naming each one.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from components.common import storage

LATEST = "latest.json"
EPOCH_MARKER = "checkpoint.json"
_EPOCH_DIR = re.compile(r"^epoch-(\d{4,})$")
_log = logging.getLogger(__name__)


class CheckpointError(ValueError):
    """Checkpoints were committed but none can be resumed from; the message names each."""


@dataclass(frozen=True)
class CheckpointInfo:
    """The latest complete checkpoint: the number of finished epochs, their metrics, and the
    model that was trained."""

    epoch: int
    prefix: str
    metrics: dict[str, float]
    model: str

    def model_problem(self, model: str, checkpoint_uri: str) -> str | None:
        """Why a run training `model` cannot resume from this checkpoint, or None."""
        if self.model == model:
            return None
        return (
            f"the checkpoints at {checkpoint_uri} were written training model {self.model!r}, "
            f"and this run trains {model!r}: resume with model={self.model!r}, or start the "
            "run in a fresh output (or checkpoint) directory"
        )


def epoch_dir(epoch: int) -> str:
    """The folder of the checkpoint after `epoch` epochs, e.g. ``epoch-0003``."""
    return f"epoch-{epoch:04d}"


def _info(raw: Any) -> CheckpointInfo:
    """A CheckpointInfo from a parsed marker; raises KeyError, TypeError or ValueError."""
    return CheckpointInfo(
        int(raw["epoch"]),
        str(raw["prefix"]),
        dict(raw.get("metrics", {})),
        str(raw["model"]),
    )


def _read_marker(uri: str) -> tuple[Any, str | None]:
    """``(parsed JSON, None)``, or ``(None, why not)`` for a missing or unreadable marker."""
    try:
        return json.loads(storage.read_text(uri)), None
    except FileNotFoundError:
        return None, "missing"
    except (ValueError, UnicodeDecodeError) as exc:
        return None, f"unreadable: {exc}"


def _files_under(checkpoint_uri: str) -> set[str]:
    """Every file below `checkpoint_uri`, as a path relative to it (``epoch-0003/ckpt.index``)."""
    files = storage.list_files(checkpoint_uri)
    if storage.is_gcs(checkpoint_uri):
        prefix = checkpoint_uri.rstrip("/") + "/"
        return {f[len(prefix) :] for f in files}
    return {Path(f).relative_to(checkpoint_uri).as_posix() for f in files}


def _check_files(checkpoint_uri: str, folder: str, files: Any, present: set[str]) -> str | None:
    """Why the files an epoch's marker lists are not all there, whole, or None if they are."""
    if not isinstance(files, dict) or not files:
        raise TypeError("its marker lists no files")
    for name, want in sorted(files.items()):
        if f"{folder}/{name}" not in present:
            return f"{name} is missing"
        data = storage.read_bytes(storage.join(checkpoint_uri, folder, name))
        if len(data) != int(want["bytes"]):
            return f"{name} has {len(data)} bytes, {int(want['bytes'])} were written"
        if hashlib.sha256(data).hexdigest() != want["sha256"]:
            return f"{name} does not match the sha256 recorded when it was written"
    return None


def _check_epoch(checkpoint_uri: str, epoch: int, present: set[str]) -> CheckpointInfo | str:
    """The checkpoint after `epoch` epochs if it is complete and intact, else why it is not."""
    folder = epoch_dir(epoch)
    if f"{folder}/{EPOCH_MARKER}" not in present:
        inside = any(f.startswith(folder + "/") for f in present)
        return f"no {EPOCH_MARKER}: incomplete" if inside else "its directory is missing"
    raw, problem = _read_marker(storage.join(checkpoint_uri, folder, EPOCH_MARKER))
    try:
        if problem is None:
            problem = _check_files(checkpoint_uri, folder, raw["files"], present)
        if problem is None:
            info = _info(raw)
            return info if info.epoch == epoch else f"its {EPOCH_MARKER} says epoch {info.epoch}"
    except (KeyError, TypeError, ValueError) as exc:
        problem = f"{EPOCH_MARKER} is malformed ({exc})"
    return problem


def _epochs_present(present: set[str]) -> set[int]:
    """The epochs that have a directory among the files `present`."""
    names = {f.split("/", 1)[0] for f in present}
    return {int(m.group(1)) for m in map(_EPOCH_DIR.match, names) if m}


def _pointer(checkpoint_uri: str) -> tuple[CheckpointInfo | None, str | None]:
    """``latest.json`` as a CheckpointInfo, or ``(None, why not)``."""
    raw, problem = _read_marker(storage.join(checkpoint_uri, LATEST))
    if problem is not None:
        return None, problem
    try:
        return _info(raw), None
    except (KeyError, TypeError, ValueError) as exc:
        return None, f"unreadable: {exc}"


def latest(checkpoint_uri: str, log: logging.Logger | None = None) -> CheckpointInfo | None:
    """The newest usable checkpoint under `checkpoint_uri`, or None for a fresh start.

    See the module docstring for the choice. `log` (default: this module's logger) gets the
    one line saying which checkpoint was passed over, when one was. Raises `CheckpointError`
    when checkpoints were committed but none checks out.
    """
    present = _files_under(checkpoint_uri)
    pointer, pointer_problem = _pointer(checkpoint_uri)
    epochs = _epochs_present(present)
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


def _file_digests(folder: Path) -> dict[str, dict[str, Any]]:
    """Size and sha256 of every file in `folder` (flat), by name."""
    return {
        p.name: {"bytes": p.stat().st_size, "sha256": hashlib.sha256(p.read_bytes()).hexdigest()}
        for p in sorted(folder.iterdir())
        if p.is_file()
    }


def save(
    checkpoint: Any,
    checkpoint_uri: str,
    epoch: int,
    metrics: dict[str, float],
    model: str,
    keep: int = 2,
) -> None:
    """Write `checkpoint` (a ``tf.train.Checkpoint``) as the state after `epoch` finished epochs
    of training `model`: its files, its ``checkpoint.json`` last, then ``latest.json``."""
    name = epoch_dir(epoch)
    marker = {"epoch": epoch, "prefix": f"{name}/ckpt", "metrics": metrics, "model": model}
    with tempfile.TemporaryDirectory(prefix="ckpt-") as tmp:
        checkpoint.write(str(Path(tmp) / "ckpt"))
        files = _file_digests(Path(tmp))
        (Path(tmp) / EPOCH_MARKER).write_text(json.dumps({**marker, "files": files}))
        target = storage.join(checkpoint_uri, name)
        storage.remove_tree(target)  # a leftover from a run killed while writing this epoch
        storage.upload_dir(tmp, target, last=EPOCH_MARKER)
    storage.write_text(storage.join(checkpoint_uri, LATEST), json.dumps(marker, sort_keys=True))
    for old in range(epoch - keep, 0, -1):
        old_uri = storage.join(checkpoint_uri, epoch_dir(old))
        if not storage.list_files(old_uri) and not storage.exists(old_uri):
            break
        storage.remove_tree(old_uri, last=EPOCH_MARKER)


def restore(checkpoint: Any, checkpoint_uri: str, info: CheckpointInfo, workdir: Path) -> None:
    """Load the checkpoint described by `info` into `checkpoint` (all ranks may call this).

    The files are copied into `workdir`, which must outlive the first training step: the
    optimizer's slots only exist after it, and TensorFlow restores them then (deferred restore).
    """
    folder = info.prefix.rsplit("/", 1)[0]
    local = storage.download_dir(storage.join(checkpoint_uri, folder), workdir / folder)
    checkpoint.read(str(local / "ckpt")).expect_partial()
