"""The sharding arithmetic (disjoint, covering, equal step counts, nothing dropped) and the
batches each rank feeds Keras: every shard sample once per epoch, reshuffled per epoch."""

from __future__ import annotations

import numpy as np
import pytest

from components.train.data import (
    RankShard,
    batch_bounds,
    epoch_batches,
    epoch_ids,
    epoch_permutation,
    shard_range,
    steps_per_epoch,
)


def test_5000_samples_on_3_ranks_split_evenly() -> None:
    sizes = [stop - start for start, stop in (shard_range(5000, r, 3) for r in range(3))]
    assert sorted(sizes) == [1666, 1667, 1667]
    assert steps_per_epoch(5000, 3, 64) == 27  # ceil(1667 / 64)


@pytest.mark.parametrize("batch", [2, 16, 32, 64])
@pytest.mark.parametrize("size", [1, 2, 3, 4, 7])
@pytest.mark.parametrize("total", [7, 10, 33, 65, 100, 1001, 5000])
def test_shards_cover_every_sample_once_in_equal_steps_of_nonempty_batches(
    total: int, size: int, batch: int
) -> None:
    ranges = [shard_range(total, r, size) for r in range(size)]
    seen = np.concatenate([np.arange(start, stop) for start, stop in ranges])
    assert np.array_equal(seen, np.arange(total))  # in order, once each: disjoint and covering
    steps = steps_per_epoch(total, size, batch)
    for start, stop in ranges:
        bounds = batch_bounds(stop - start, steps)
        assert len(bounds) == steps  # every rank runs the same number of steps: no deadlock
        assert all(0 < hi - lo <= batch for lo, hi in bounds)  # no empty batch
        covered = np.concatenate([np.arange(lo, hi) for lo, hi in bounds])
        assert np.array_equal(covered, np.arange(stop - start))  # each sample once per epoch


def test_a_shard_too_small_for_the_steps_a_bad_rank_and_a_bad_batch_are_errors() -> None:
    # 10 samples on 3 ranks at batch 1: the 4-sample rank needs 4 steps, a 3-sample rank can't.
    steps = steps_per_epoch(10, 3, 1)
    with pytest.raises(ValueError, match="cannot fill 4 steps"):
        batch_bounds(3, steps)
    with pytest.raises(ValueError, match="rank 3 is not in a world of size 3"):
        shard_range(10, 3, 3)
    with pytest.raises(ValueError, match="batch size"):
        steps_per_epoch(10, 2, 0)


def test_permutation_is_deterministic_and_changes_per_epoch() -> None:
    a = epoch_permutation(100, seed=1, epoch=0, rank=0)
    assert np.array_equal(a, epoch_permutation(100, seed=1, epoch=0, rank=0))
    assert not np.array_equal(a, epoch_permutation(100, seed=1, epoch=1, rank=0))
    assert np.array_equal(np.sort(a), np.arange(100))


def _shard(n: int, steps: int) -> RankShard:
    return RankShard(
        images=np.zeros((n, 28, 28), np.uint8), labels=np.zeros(n, np.uint8),
        start=100, stop=100 + n, steps=steps, total=1000, manifest_sha256="",
    )  # fmt: skip


def test_each_epoch_serves_every_sample_once_in_its_own_order() -> None:
    shard = _shard(n=333, steps=11)
    rows, lengths = epoch_batches(shard, seed=7, rank=1, epochs=range(2, 5))
    assert rows.shape[0] == lengths.shape[0] == 3 * 11
    orders = []
    for k in range(3):
        epoch = [rows[k * 11 + b, : lengths[k * 11 + b]] for b in range(11)]
        assert all(len(batch) > 0 for batch in epoch)
        served = np.concatenate(epoch)
        assert np.array_equal(np.sort(served), np.arange(333))
        orders.append(served)
    assert not np.array_equal(orders[0], orders[1])


def test_resumed_epochs_are_the_same_batches_as_uninterrupted_ones() -> None:
    shard = _shard(n=50, steps=4)
    full_rows, full_lengths = epoch_batches(shard, seed=3, rank=0, epochs=range(0, 4))
    resumed_rows, resumed_lengths = epoch_batches(shard, seed=3, rank=0, epochs=range(2, 4))
    assert np.array_equal(full_rows[8:], resumed_rows)
    assert np.array_equal(full_lengths[8:], resumed_lengths)
    ids = epoch_ids(shard, seed=3, rank=0, epoch=2)  # what the coverage check gathers
    assert np.array_equal(np.sort(ids), np.arange(100, 150))
