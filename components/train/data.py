"""The data room: this rank's disjoint shard of the training split, its batches each epoch,
and the ``tf.data`` pipeline that serves them.

Rank *r* of *n* reads only samples ``[r*N/n, (r+1)*N/n)`` (`sharding.shard_range`), every rank
runs the same number of steps, and each epoch visits the shard once in a per-rank order. The
ranks' ids of an epoch are checked to cover the split exactly once (`coverage`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from components.common import dataset
from components.train.config import TrainConfig
from components.train.sharding import batch_bounds, epoch_permutation, shard_range, steps_per_epoch
from components.train.summary import Coverage


@dataclass
class Shard:
    """This rank's part of the training split."""

    images: np.ndarray
    labels: np.ndarray
    start: int
    stop: int
    steps: int
    total: int
    manifest_sha256: str


def load_shard(config: TrainConfig, rank: int, size: int) -> Shard:
    """Read this rank's disjoint block of the training split. Raises DataError naming the file."""
    manifest = dataset.read_manifest(config.data)
    total = manifest.count("train")
    start, stop = shard_range(total, rank, size)
    if stop <= start:
        raise dataset.DataError(
            f"{config.data}: the train split has {total} samples, so rank {rank} of {size} gets "
            "an empty shard; use fewer workers or more data"
        )
    steps = steps_per_epoch(total, size, config.batch_size_per_worker)
    try:
        batch_bounds(stop - start, steps)
    except ValueError as exc:
        raise dataset.DataError(f"{config.data}: {exc}") from exc
    images, labels = dataset.load_range(manifest, "train", start, stop)
    return Shard(images, labels, start, stop, steps, total, manifest.sha256)


def epoch_batches(
    shard: Shard, seed: int, rank: int, epochs: range
) -> tuple[np.ndarray, np.ndarray]:
    """Every batch of `epochs` as rows of shard-local sample indices, padded, plus their lengths.

    Epoch ``e`` visits the shard in the order ``epoch_permutation(n, seed, e, rank)``, cut into
    ``shard.steps`` consecutive batches by ``batch_bounds``: each sample once per epoch.
    """
    n = len(shard.labels)
    bounds = batch_bounds(n, shard.steps)
    width = max(hi - lo for lo, hi in bounds)
    rows = np.zeros((len(epochs) * shard.steps, width), np.int64)
    lengths = np.zeros(len(epochs) * shard.steps, np.int64)
    for k, epoch in enumerate(epochs):
        order = epoch_permutation(n, seed, epoch, rank)
        for b, (lo, hi) in enumerate(bounds):
            rows[k * shard.steps + b, : hi - lo] = order[lo:hi]
            lengths[k * shard.steps + b] = hi - lo
    return rows, lengths


def make_dataset(tf: Any, shard: Shard, rows: np.ndarray, lengths: np.ndarray, threads: int) -> Any:
    """A ``tf.data`` pipeline serving those batches in order, gathered inside TensorFlow.

    It replaced a Keras ``Sequence`` (numpy indexing in Python) after the input-pipeline
    benchmark measured the Sequence 1.29x slower in one process (bench/README.md).
    """
    images = tf.constant(shard.images)
    labels = tf.constant(shard.labels)

    def gather(row: Any, length: Any) -> tuple[Any, Any]:
        picked = row[:length]
        return tf.gather(images, picked), tf.gather(labels, picked)

    options = tf.data.Options()
    options.threading.private_threadpool_size = threads  # stay within this rank's share
    options.deterministic = True
    return (
        tf.data.Dataset.from_tensor_slices((rows, lengths))
        .map(gather)
        .prefetch(2)
        .with_options(options)
    )


@dataclass(frozen=True)
class EpochPlan:
    """The batches of the epochs a fit runs, from epoch `start` on (see `epoch_batches`)."""

    start: int
    rows: np.ndarray
    lengths: np.ndarray
    steps: int

    def epoch_ids(self, shard: Shard, epoch: int) -> np.ndarray:
        """The global sample ids this rank serves in `epoch`, batch by batch."""
        first = (epoch - self.start) * self.steps
        rows, lengths = self.rows[first : first + self.steps], self.lengths[first:]
        return shard.start + np.concatenate(
            [row[:n] for row, n in zip(rows, lengths[: len(rows)], strict=True)]
        )

    def first_epoch_ids(self, shard: Shard) -> np.ndarray:
        return self.epoch_ids(shard, self.start)


def plan_epochs(shard: Shard, config: TrainConfig, rank: int, start: int) -> EpochPlan:
    """The batches of the epochs left after `start` (or, if none are, of one epoch: for the
    coverage check)."""
    epochs_left = range(start, config.epochs) or range(start, start + 1)
    rows, lengths = epoch_batches(shard, config.seed, rank, epochs_left)
    return EpochPlan(start, rows, lengths, shard.steps)


def coverage(all_ids: list[np.ndarray], total: int) -> Coverage:
    """Whether the ranks' ids of one epoch (one array per rank) cover 0..total-1 exactly once."""
    ids = np.concatenate(all_ids)
    return {
        "seen_per_epoch": int(len(ids)),
        "disjoint": bool(len(np.unique(ids)) == len(ids)),
        "covers_all": bool(np.array_equal(np.sort(ids), np.arange(total))),
    }
