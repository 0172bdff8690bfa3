"""This rank's disjoint shard of the training split, its batches each epoch, and the
``tf.data`` pipeline that serves them.

Rank *r* of *n* reads samples ``[r*N/n, (r+1)*N/n)``. All ranks run the *same* number of steps
per epoch (a rank one step short would leave the others waiting forever in an allreduce), each
cutting its block into that many nearly equal batches: no sample is dropped or repeated.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from components.common import dataset
from components.common.failure import InputError


def shard_range(num_samples: int, rank: int, size: int) -> tuple[int, int]:
    """The range ``[start, stop)`` of global sample indices that `rank` reads."""
    if size < 1 or not 0 <= rank < size:
        raise ValueError(f"rank {rank} is not in a world of size {size}")
    return num_samples * rank // size, num_samples * (rank + 1) // size


def steps_per_epoch(num_samples: int, size: int, batch_size: int) -> int:
    """Steps every rank runs per epoch: enough for the largest shard at `batch_size`."""
    if batch_size < 1:
        raise ValueError(f"batch size must be >= 1, got {batch_size}")
    largest = math.ceil(num_samples / size)
    return max(1, math.ceil(largest / batch_size))


def batch_bounds(shard_size: int, steps: int) -> list[tuple[int, int]]:
    """Split ``range(shard_size)`` into `steps` consecutive, non-empty, nearly equal batches."""
    if shard_size < steps:
        raise InputError(
            f"a shard of {shard_size} samples cannot fill {steps} steps without an empty batch; "
            "use a batch size above 1 or fewer workers"
        )
    edges = [shard_size * i // steps for i in range(steps + 1)]
    return list(zip(edges[:-1], edges[1:], strict=True))


def epoch_permutation(shard_size: int, seed: int, epoch: int, rank: int) -> np.ndarray:
    """The order in which `rank` visits its shard in `epoch` (deterministic, differs per epoch)."""
    return np.random.default_rng([seed, epoch, rank]).permutation(shard_size)


@dataclass
class RankShard:
    """This rank's block of the training split, samples ``[start, stop)`` of `total`, served
    in `steps` batches an epoch."""

    images: np.ndarray
    labels: np.ndarray
    start: int
    stop: int
    steps: int
    total: int
    manifest_sha256: str


def load_shard(data: str, batch_size: int, rank: int, size: int) -> RankShard:
    """This rank's block of the training split (DataError naming the file)."""
    manifest = dataset.read_manifest(data)
    total = manifest.count("train")
    start, stop = shard_range(total, rank, size)
    if stop <= start:
        raise dataset.DataError(
            f"{data}: the train split has {total} samples, so rank {rank} of {size} gets "
            "an empty shard; use fewer workers or more data"
        )
    steps = steps_per_epoch(total, size, batch_size)
    try:
        batch_bounds(stop - start, steps)
    except ValueError as exc:
        raise dataset.DataError(f"{data}: {exc}") from exc
    images, labels = dataset.load_range(manifest, "train", start, stop)
    return RankShard(images, labels, start, stop, steps, total, manifest.sha256)


def epoch_batches(
    shard: RankShard, seed: int, rank: int, epochs: range
) -> tuple[np.ndarray, np.ndarray]:
    """Every batch of `epochs` as rows of shard-local sample indices, padded, plus their lengths:
    each epoch's `epoch_permutation` cut by `batch_bounds`."""
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


def epoch_ids(shard: RankShard, seed: int, rank: int, epoch: int) -> np.ndarray:
    """The global sample ids this rank serves in `epoch`, batch by batch."""
    rows, lengths = epoch_batches(shard, seed, rank, range(epoch, epoch + 1))
    return shard.start + np.concatenate([row[:n] for row, n in zip(rows, lengths, strict=True)])


def make_dataset(
    tf: Any, shard: RankShard, seed: int, rank: int, epochs: range, threads: int
) -> Any:
    """A ``tf.data`` pipeline serving the batches of `epochs`, gathered inside TensorFlow: a
    Keras ``Sequence`` indexing in numpy measured 1.29x slower (bench/README.md)."""
    rows, lengths = epoch_batches(shard, seed, rank, epochs)
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


def coverage(all_ids: list[np.ndarray], total: int) -> dict[str, Any]:
    """Whether the ranks' ids of one epoch (one array per rank) cover 0..total-1 exactly once."""
    ids = np.concatenate(all_ids)
    return {
        "samples": total,
        "seen_per_epoch": int(len(ids)),
        "disjoint": bool(len(np.unique(ids)) == len(ids)),
        "covers_all": bool(np.array_equal(np.sort(ids), np.arange(total))),
    }
