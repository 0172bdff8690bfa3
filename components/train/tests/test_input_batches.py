"""The batches each rank feeds Keras: every shard sample once per epoch, reshuffled per epoch."""

from __future__ import annotations

import numpy as np

from components.train.data import Shard, epoch_batches


def _shard(n: int, steps: int) -> Shard:
    return Shard(
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
