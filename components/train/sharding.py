"""Pure arithmetic of who reads what. No Horovod, no TF: easy to test exhaustively.

Every rank gets a contiguous, disjoint block of the training split; together the blocks cover
every sample. Uneven splits are fine: all ranks run the *same* number of steps per epoch (a
rank that ran one step fewer would leave the others waiting forever in an allreduce), and each
rank divides its block into that many nearly equal batches, so no sample is dropped or
repeated within an epoch.
"""

from __future__ import annotations

import math

import numpy as np


def shard_range(num_samples: int, rank: int, size: int) -> tuple[int, int]:
    """The half-open range ``[start, stop)`` of global sample indices that `rank` reads."""
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
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    if shard_size < steps:
        raise ValueError(
            f"a shard of {shard_size} samples cannot fill {steps} steps without an empty batch; "
            "use a batch size above 1 or fewer workers"
        )
    edges = [shard_size * i // steps for i in range(steps + 1)]
    return list(zip(edges[:-1], edges[1:], strict=True))


def epoch_permutation(shard_size: int, seed: int, epoch: int, rank: int) -> np.ndarray:
    """The order in which `rank` visits its shard in `epoch` (deterministic, differs per epoch)."""
    return np.random.default_rng([seed, epoch, rank]).permutation(shard_size)
