"""This rank's part of the training split, streamed from the dataset's TFRecord shards
(`plan_rank`, `make_dataset`). Runs in each rank; the launcher's preflight uses its
`ranks_problem`.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from components.common import dataset
from components.common.dataset import ImageSpec, Manifest
from components.common.failure import InputError
from components.common.shard_files import piece_records

# Rank *r* of *n* reads samples ``[r*N/n, (r+1)*N/n)`` of the split, numbered in the manifest's
# shard order (`plan_rank`): only the shards that overlap its block, and of the first and last only
# the records inside it. All ranks run the *same* number of steps per epoch (a rank one step short
# would leave the others waiting forever in an allreduce), each cutting its block into that many
# nearly equal batches: no sample is dropped or repeated.
#
# Each epoch a rank visits its shards in an order of its own, reads several at once, shuffles the
# records in a buffer of bounded size (`SHUFFLE_BUFFER_BYTES`) and decodes whole batches in parallel
# (`make_dataset`): its memory is bounded by that buffer and a few batches, not by the dataset.
# Shards on GCS are streamed (`components.common.shard_files`).
#
# The shuffle buffer's size in bytes of records (the number of records follows from the
# image's size: the whole of a 2,000-digit block, 200 records of 224x224 RGB images).
SHUFFLE_BUFFER_BYTES = 32 * 2**20
# Shard files a rank reads from at once.
CYCLE_LENGTH = 4


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


def ranks_problem(train_samples: int, world_size: int, batch_size: int) -> str | None:
    """Why a job of `world_size` ranks cannot train on `train_samples` samples, or None: every
    rank needs a sample, and a batch in each of the same number of steps."""
    if train_samples < world_size:
        return (
            f"the train split has {train_samples} samples, fewer than the job's {world_size} "
            "ranks: every rank needs samples of its own; use fewer workers or more data"
        )
    smallest = train_samples // world_size
    steps = steps_per_epoch(train_samples, world_size, batch_size)
    if smallest < steps:
        return (
            f"the train split's {train_samples} samples give a rank {smallest}, too few for "
            f"{steps} steps of at most {batch_size}: use a batch size above 1 or fewer workers"
        )
    return None


@dataclass(frozen=True)
class Piece:
    """Records ``[skip, skip + take)`` of one shard file."""

    uri: str
    sha256: str
    skip: int
    take: int


@dataclass(frozen=True)
class RankPlan:
    """This rank's block of the training split, samples ``[start, stop)`` of `total`, served
    in `steps` batches an epoch from `pieces` of the shard files."""

    start: int
    stop: int
    steps: int
    total: int
    pieces: tuple[Piece, ...]
    image: ImageSpec
    classes: tuple[str, ...]
    manifest_sha256: str

    @property
    def samples(self) -> int:
        return self.stop - self.start


def plan_rank(manifest: Manifest, batch_size: int, rank: int, size: int) -> RankPlan:
    """The shard pieces holding `rank`'s block of the training split (DataError naming the
    dataset when the block cannot fill the job's steps)."""
    total = manifest.count("train")
    problem = ranks_problem(total, size, batch_size)
    if problem:
        raise dataset.DataError(f"{manifest.root}: {problem}")
    start, stop = shard_range(total, rank, size)
    steps = steps_per_epoch(total, size, batch_size)
    pieces, offset = [], 0
    for shard in manifest.shards("train"):
        lo, hi = max(start, offset), min(stop, offset + shard.count)
        if lo < hi:
            pieces.append(Piece(manifest.uri(shard), shard.sha256, lo - offset, hi - lo))
        offset += shard.count
    return RankPlan(
        start, stop, steps, total, tuple(pieces), manifest.image, manifest.classes, manifest.sha256
    )


def shuffle_buffer(plan: RankPlan) -> int:
    """Records in the shuffle buffer: `SHUFFLE_BUFFER_BYTES` of them, at most the block."""
    return max(1, min(plan.samples, SHUFFLE_BUFFER_BYTES // max(1, plan.image.pixels)))


def make_dataset(tf: Any, plan: RankPlan, seed: int, rank: int, epochs: range, threads: int) -> Any:
    """A ``tf.data`` pipeline serving this rank's batches of `epochs`: each epoch its pieces in
    a seeded order of their own, `CYCLE_LENGTH` of them read at once, its records shuffled in
    a buffer of `shuffle_buffer` records, cut into `batch_bounds`' batches (``rebatch``: no
    function runs per record) and decoded a batch at a time."""
    pieces = plan.pieces
    sizes = [hi - lo for lo, hi in batch_bounds(plan.samples, plan.steps)]
    records = piece_records(tf, [(p.uri, p.sha256, p.skip, p.take) for p in pieces])
    buffer = shuffle_buffer(plan)

    def epoch_batches(epoch: int) -> Any:
        epoch_seed = tf.constant([seed, epoch * 1009 + rank], tf.int64)
        order = tf.argsort(tf.random.stateless_uniform([len(pieces)], seed=epoch_seed))
        return (
            tf.data.Dataset.from_tensor_slices(tf.cast(order, tf.int64))
            .interleave(
                records,
                cycle_length=min(CYCLE_LENGTH, len(pieces)),
                num_parallel_calls=tf.data.AUTOTUNE,
                deterministic=True,
            )
            .shuffle(buffer, seed=seed * 1_000_003 + epoch * 1009 + rank)
            .batch(max(sizes))
            .rebatch(sizes)  # the epoch's records are exactly its batches' sizes
        )

    options = tf.data.Options()
    options.threading.private_threadpool_size = threads  # stay within this rank's share
    options.deterministic = True
    # One dataset per epoch, chained, so that each shuffle's seed is a Python int: a tensor
    # seed (``flat_map`` over the epochs) fails to trace when the global seed is 0.
    batches = functools.reduce(lambda a, b: a.concatenate(b), map(epoch_batches, epochs))
    return (
        batches.map(
            lambda serialized: dataset.decode_records(tf, serialized, plan.image),
            num_parallel_calls=tf.data.AUTOTUNE,
        )
        .prefetch(tf.data.AUTOTUNE)
        .with_options(options)
    )


def coverage(blocks: list[tuple[int, int]], total: int) -> dict[str, Any]:
    """Whether the ranks' blocks of one epoch (``[start, stop)`` each) cover 0..total-1 exactly
    once: every sample once per epoch across the ranks."""
    ids = np.concatenate([np.arange(start, stop) for start, stop in blocks])
    return {
        "samples": total,
        "seen_per_epoch": int(len(ids)),
        "disjoint": bool(len(np.unique(ids)) == len(ids)),
        "covers_all": bool(np.array_equal(np.sort(ids), np.arange(total))),
    }
