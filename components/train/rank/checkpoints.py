"""Per-epoch checkpoints, kept by ``tf.train.CheckpointManager`` in the rank's local work folder
and uploaded with the storage layer to a local path or gs://: written by rank 0, found on resume
by rank 0 (every rank of an elastic job) and restored by every rank. Runs in each rank.
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

# Layout of the checkpoint location: ``ckpt-3.index`` and ``ckpt-3.data-00000-of-00001`` (the
# ``tf.train.Checkpoint`` after 3 finished epochs: the model, the optimizer and the run's record,
# its model and metrics), and ``checkpoint``, the manager's state file naming the newest and the
# kept ones (the last `KEEP`). A save uploads the new checkpoint's data files, then its index, then
# the state file, and only then deletes the files of the checkpoints the manager let go: a run
# killed mid-upload resumes from the previous complete checkpoint. The state file is the commit.
#
# GCS checks each file's CRC32C on upload and download; TensorFlow checks each tensor's CRC32C,
# recorded in the index, when it reads the checkpoint. `latest` downloads the checkpoint the state
# file names and reads every tensor of it, then the older ones, newest first, until one reads whole;
# one log line says which were passed over and why. Once anything was committed, a resume never
# silently starts from scratch: no checkpoint that reads whole is a `CheckpointError` naming each
# one.
STATE = "checkpoint"  # tf.train.CheckpointManager's state file
NAME = "ckpt"  # the manager's checkpoint_name: ckpt-<epoch>.index, ckpt-<epoch>.data-...
KEEP = 2
LOCAL = "checkpoints"  # the manager's folder in the rank's work folder
# The run's record (a string variable of the checkpoint): its key in the checkpoint.
RECORD_KEY = "run/.ATTRIBUTES/VARIABLE_VALUE"
_FILE = re.compile(rf"^({NAME}-(\d+))\.(index|data-\d+-of-\d+)$")
# The layout before the manager kept the checkpoints (the tf-keras trainer's too).
_EARLIER = re.compile(r"^(latest\.json|epoch-\d{4,}/.*)$")
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

    @classmethod
    def of(cls, raw: Any) -> CheckpointInfo:
        """From a parsed run record; raises KeyError, TypeError or ValueError."""
        epoch = int(raw["epoch"])
        return cls(epoch, name(epoch), dict(raw.get("metrics", {})), str(raw["model"]))

    def resume_problem(self, model: str, checkpoint_uri: str) -> str | None:
        """Why a run training `model` cannot resume from this checkpoint, or None."""
        if self.model == model:
            return None
        return (
            f"the checkpoints at {checkpoint_uri} were written training model {self.model!r}, "
            f"and this run trains {model!r}: resume with model={self.model!r}, or start the "
            "run in a fresh output (or checkpoint) directory"
        )


def name(epoch: int) -> str:
    """The checkpoint after `epoch` epochs: the prefix of its files."""
    return f"{NAME}-{epoch}"


def new_checkpoint(model: Any, optimizer: Any) -> Any:
    """The ``tf.train.Checkpoint`` of `model` and `optimizer` (built already, so that a restore
    fills every slot), with the run's record beside them."""
    import tensorflow as tf

    with tf.device("/cpu:0"):
        record = tf.Variable("", dtype=tf.string, trainable=False)
    return tf.train.Checkpoint(model=model, optimizer=optimizer, run=record)


def _read_state(local: Path) -> tuple[int | None, str | None]:
    """The epoch of the newest checkpoint the state file in `local` names, or ``(None, why
    not)``; TensorFlow's own warnings about the file are kept out of the log."""
    import tensorflow as tf

    heard: list[str] = []

    def hush(record: logging.LogRecord) -> bool:
        heard.append(record.getMessage())
        return False

    tf_logger = tf.get_logger()
    tf_logger.addFilter(hush)
    try:
        state = tf.train.get_checkpoint_state(str(local))
    except ValueError as exc:  # a state naming no checkpoint
        heard.insert(0, str(exc))
        state = None
    finally:
        tf_logger.removeFilter(hush)
    newest = _FILE.match(Path(state.model_checkpoint_path).name + ".index") if state else None
    if newest is None:
        why = heard[0].splitlines()[0][:200] if heard else "it names no checkpoint of this trainer"
        return None, f"unreadable: {why}"
    return int(newest[2]), None


def _fetch_state(checkpoint_uri: str, local: Path) -> tuple[int | None, str | None]:
    """The remote state file, copied into `local` if it reads (else removed there), and what
    `_read_state` says of it (``(None, "missing")`` if there is none)."""
    target = local / STATE
    try:
        storage.download_file(storage.join(checkpoint_uri, STATE), target)
    except FileNotFoundError:
        target.unlink(missing_ok=True)
        return None, "missing"
    newest, problem = _read_state(local)
    if problem is not None:
        target.unlink()
    return newest, problem


def _download(checkpoint_uri: str, files: list[str], local: Path) -> None:
    local.mkdir(parents=True, exist_ok=True)
    for rel in files:
        storage.download_file(storage.join(checkpoint_uri, rel), local / rel)


def _check(checkpoint_uri: str, epoch: int, present: set[str], local: Path) -> CheckpointInfo | str:
    """The checkpoint after `epoch` epochs, downloaded into `local`, if every tensor of it
    reads back whole, else why not (its files removed from `local` again)."""
    import tensorflow as tf

    prefix = name(epoch)
    files = sorted(f for f in present if (m := _FILE.match(f)) and m[1] == prefix)
    if not files:
        return "its files are missing"
    if f"{prefix}.index" not in files:
        return f"{prefix}.index is missing"
    try:
        _download(checkpoint_uri, files, local)
    except FileNotFoundError as exc:  # gone since the listing: rotated away by a newer save
        return f"a file of it is gone ({exc})"
    try:
        reader = tf.train.load_checkpoint(str(local / prefix))
        keys = reader.get_variable_to_dtype_map()
        for key in keys:  # TensorFlow checks each tensor's CRC32C as it reads it
            reader.get_tensor(key)
    except Exception as exc:  # TF's errors, and an IndexError for a data file cut short
        for rel in files:
            (local / rel).unlink(missing_ok=True)
        said = (str(exc).splitlines() or [type(exc).__name__])[0].replace(f"{local}/", "")
        return f"TensorFlow cannot read it: {said[:200]}"
    if RECORD_KEY not in keys:
        return "it holds no run record (not a checkpoint of this trainer)"
    try:
        info = CheckpointInfo.of(json.loads(reader.get_tensor(RECORD_KEY)))
    except (KeyError, TypeError, ValueError) as exc:
        return f"its run record is malformed ({exc})"
    return info if info.epoch == epoch else f"its run record says epoch {info.epoch}"


def latest(
    checkpoint_uri: str, log: logging.Logger | None = None, workdir: Path | None = None
) -> CheckpointInfo | None:
    """The newest usable checkpoint under `checkpoint_uri`, or None for a fresh start (see the
    module doc); its files are left in `workdir` (default: a temporary folder) for `restore`.
    `log` (default: this module's) gets the line naming what was passed over."""
    if workdir is None:
        with tempfile.TemporaryDirectory(prefix="ckpt-") as tmp:
            return latest(checkpoint_uri, log, Path(tmp))
    local = workdir / LOCAL
    local.mkdir(parents=True, exist_ok=True)
    present = set(storage.relative_files(checkpoint_uri))
    numbers = {int(m[2]) for m in map(_FILE.match, present) if m}
    if STATE in present:
        newest, state_problem = _fetch_state(checkpoint_uri, local)
    else:
        newest, state_problem = None, "missing"
        if any(_EARLIER.match(f) for f in present):
            raise CheckpointError(
                f"the checkpoints at {checkpoint_uri} were written by an earlier trainer "
                "(latest.json and epoch-NNNN/ folders: the tf-keras trainer's, or this one's "
                "before tf.train.CheckpointManager kept them), which this one cannot resume "
                "from: start the run in a fresh output (or checkpoint) directory"
            )
        if not any(f"{name(n)}.index" in present for n in numbers):
            return None  # nothing was committed: a fresh start
    if newest is None:
        newest = max(numbers, default=0)
    candidates = {n for n in numbers if n <= newest} | ({newest} if newest > 0 else set())
    passed_over = [] if state_problem is None else [f"the state file {STATE} is {state_problem}"]
    for epoch in sorted(candidates, reverse=True):
        found = _check(checkpoint_uri, epoch, present, local)
        if isinstance(found, CheckpointInfo):
            if passed_over:
                (log or _log).warning("%s; resuming from epoch %d", "; ".join(passed_over), epoch)
            return found
        passed_over.append(f"checkpoint after epoch {epoch} is unreadable ({found})")
    raise CheckpointError(
        f"checkpoints were written to {checkpoint_uri}, but none can be resumed from: "
        f"{'; '.join(passed_over) or 'no checkpoint files'}. Not starting from scratch: "
        "restore the checkpoints, or start the run in a fresh output (or checkpoint) directory"
    )


def committed(checkpoint_uri: str) -> int:
    """The epoch of the newest checkpoint the state file at `checkpoint_uri` names, its files
    unchecked (0: no state file, or one that does not read)."""
    with tempfile.TemporaryDirectory(prefix="ckpt-") as tmp:
        newest, _ = _fetch_state(checkpoint_uri, Path(tmp))
    return newest or 0


def restore(checkpoint: Any, checkpoint_uri: str, info: CheckpointInfo, workdir: Path) -> None:
    """Load `info`'s checkpoint into `checkpoint` (any rank; downloaded into `workdir` unless
    `latest` left it there): every value it holds, into a model and optimizer built already
    (else a CheckpointError: never a part)."""
    local = workdir / LOCAL
    if not (local / f"{info.prefix}.index").exists():
        files = [
            f for f in storage.relative_files(checkpoint_uri) if f.startswith(info.prefix + ".")
        ]
        _download(checkpoint_uri, files, local)
    try:
        checkpoint.restore(str(local / info.prefix)).assert_consumed()
    # TF says which values found no variable, or the reverse (AssertionError), or which value
    # has another shape than its variable (ValueError: the same model for another dataset)
    except (AssertionError, ValueError) as exc:
        raise CheckpointError(
            f"the checkpoint after epoch {info.epoch} at {checkpoint_uri} does not fit the "
            f"model and optimizer of this run ({str(exc).splitlines()[0][:200]}); start the run "
            "in a fresh output (or checkpoint) directory"
        ) from exc


class Saver:
    """Rank 0's checkpoints: a ``tf.train.CheckpointManager`` in `workdir`, which goes on from
    the state file at `checkpoint_uri` (a resumed run's, or the rank 0 before an elastic
    reset's), each save uploaded there (see the module doc)."""

    def __init__(self, checkpoint: Any, checkpoint_uri: str, workdir: Path) -> None:
        import tensorflow as tf

        self.checkpoint, self.uri, self.local = checkpoint, checkpoint_uri, workdir / LOCAL
        self.local.mkdir(parents=True, exist_ok=True)
        _fetch_state(checkpoint_uri, self.local)
        self.manager = tf.train.CheckpointManager(
            checkpoint, str(self.local), max_to_keep=KEEP, checkpoint_name=NAME
        )

    def save(self, epoch: int, metrics: dict[str, float], model: str) -> None:
        """Save the state after `epoch` finished epochs of training `model`, and upload it: its
        data files, its index, the state file; then delete what the manager let go."""
        record = {"epoch": epoch, "metrics": metrics, "model": model}
        self.checkpoint.run.assign(json.dumps(record, sort_keys=True))
        prefix = Path(self.manager.save(checkpoint_number=epoch)).name
        written = sorted(self.local.glob(prefix + ".*"), key=lambda p: (p.suffix == ".index", p))
        for path in written:
            storage.upload_file(path, storage.join(self.uri, path.name))
        storage.upload_file(self.local / STATE, storage.join(self.uri, STATE))
        kept = {Path(p).name for p in self.manager.checkpoints}
        gone = [
            f
            for f in storage.relative_files(self.uri)
            if (m := _FILE.match(f)) and m[1] not in kept
        ]
        for rel in sorted(gone, key=lambda f: (f.endswith(".index"), f)):  # as uploaded: index last
            storage.remove_file(storage.join(self.uri, rel))
