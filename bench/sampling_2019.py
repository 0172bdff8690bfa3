"""The project's trainer with the 2019 example's sampling instead of disjoint shards.

In the 2019 Horovod Keras example every rank drew its batches at random from the FULL
training set and ran ``len / N`` steps per epoch, so ranks overlap and some samples are
missed each epoch. This rank program passes the trainer that `Sampling` (the shard it loads
and the batches it draws from it); everything else (model, DistributedOptimizer, learning
rate, callbacks, export) is the project's code. Run under horovodrun like the trainer::

    horovodrun -np 2 --gloo python -m bench.sampling_2019 --data D --output O --expected-workers 2
"""

from __future__ import annotations

import sys
from collections.abc import Callable

import numpy as np

from components.train import cli, data, trainer
from components.train.config import TrainConfig
from components.train.sharding import steps_per_epoch

Batches = Callable[[data.Shard, int, int, range], tuple[np.ndarray, np.ndarray]]


def load_full_set(config: TrainConfig, rank: int, size: int) -> data.Shard:
    """Every rank loads the whole training split but runs only ``len / N`` steps."""
    whole = data.load_shard(config, 0, 1)
    whole.steps = steps_per_epoch(whole.total, size, config.batch_size_per_worker)
    return whole


def make_random_batches(batch_size: int) -> Batches:
    """Per rank and epoch, random batches from the full set (the 2019 example's sampling)."""

    def epoch_batches(
        shard: data.Shard, seed: int, rank: int, epochs: range
    ) -> tuple[np.ndarray, np.ndarray]:
        rows = np.zeros((len(epochs) * shard.steps, batch_size), np.int64)
        lengths = np.full(len(epochs) * shard.steps, batch_size, np.int64)
        for k, epoch in enumerate(epochs):
            drawn = np.random.default_rng([seed, epoch, rank]).permutation(len(shard.labels))
            rows[k * shard.steps : (k + 1) * shard.steps] = drawn[
                : shard.steps * batch_size
            ].reshape(shard.steps, batch_size)
        return rows, lengths

    return epoch_batches


def sampling_2019(batch_size: int) -> data.Sampling:
    """The 2019 example's sampling: the full set on every rank, random batches."""
    return data.Sampling(load=load_full_set, batches=make_random_batches(batch_size))


def main(argv: list[str] | None = None) -> int:
    """Parse the trainer's arguments and run this rank with the 2019 sampling."""
    config = cli.parse_args(argv)
    return trainer.run(config, sampling_2019(config.batch_size_per_worker))


if __name__ == "__main__":
    sys.exit(main())
