"""The project's trainer with the 2019 example's sampling instead of disjoint shards.

In the 2019 Horovod Keras example every rank drew its batches at random from the FULL
training set and ran ``len / N`` steps per epoch, so ranks overlap and some samples are
missed each epoch. This rank program swaps only that part of the real trainer (the shard it
loads and the order it visits it in); everything else (model, DistributedOptimizer, learning
rate, callbacks, export) is the project's code. Run under horovodrun like the trainer::

    horovodrun -np 2 --gloo python -m bench.sampling_2019 --data D --output O --expected-workers 2
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

from components.train import cli, trainer
from components.train.config import TrainConfig
from components.train.sharding import steps_per_epoch


def load_full_set(config: TrainConfig, rank: int, size: int) -> trainer.Shard:
    """Every rank loads the whole training split but runs only ``len / N`` steps."""
    whole = _ORIGINAL_LOAD_SHARD(config, 0, 1)
    whole.steps = steps_per_epoch(whole.total, size, config.batch_size_per_worker)
    return whole


def make_random_sequence(batch_size: int) -> Any:
    """A ``make_sequence`` replacement: random batches from the full set, per rank and epoch."""

    def make_sequence(tf: Any, shard: trainer.Shard, seed: int, rank: int, first_epoch: int) -> Any:
        class RandomBatches(tf.keras.utils.Sequence):  # type: ignore[misc, name-defined]
            def __init__(self) -> None:
                super().__init__()
                self.epoch = first_epoch
                self.order = self._draw()

            def _draw(self) -> np.ndarray:
                rng = np.random.default_rng([seed, self.epoch, rank])
                return rng.permutation(len(shard.labels))[: shard.steps * batch_size]

            def __len__(self) -> int:
                return shard.steps

            def __getitem__(self, index: int) -> tuple[np.ndarray, np.ndarray]:
                rows = self.order[index * batch_size : (index + 1) * batch_size]
                return shard.images[rows], shard.labels[rows]

            def on_epoch_end(self) -> None:
                self.epoch += 1
                self.order = self._draw()

            def global_ids_of_epoch(self) -> np.ndarray:
                return self.order.copy()

        return RandomBatches()

    return make_sequence


_ORIGINAL_LOAD_SHARD = trainer.load_shard


def main(argv: list[str] | None = None) -> int:
    """Parse the trainer's arguments, swap the sampling, run this rank."""
    config = cli.parse_args(argv)
    trainer.load_shard = load_full_set  # type: ignore[assignment]
    trainer.make_sequence = make_random_sequence(config.batch_size_per_worker)  # type: ignore[assignment]
    return trainer.run(config)


if __name__ == "__main__":
    sys.exit(main())
