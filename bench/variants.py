"""The trainer variants the benchmarks measure, built here, on the benchmarks' side.

``python -m bench.variants [--groups N] [--optimizer adadelta] [--snapshots DIR --per-epoch K]
-- TRAINER ARGS`` runs the project's trainer (``components.train.rank.cli.main``) with:

- ``--groups N``: Horovod's grouped allreduce (``DistributedOptimizer(groups=N)``: the
  gradients go as N groups instead of being left to tensor fusion);
- ``--optimizer adadelta``: the seed example's optimizer (Horovod's keras_mnist_advanced.py:
  Adadelta at the scaled learning rate, to run with ``--learning-rate 1.0``), in place of Adam;
- ``--snapshots DIR``: rank 0 saves the weights ``--per-epoch`` times an epoch and records, for
  each, the training time from the first step and the wall clock, both without the time the
  saving took (``DIR/snapshots.json``). The benchmark scores them after the job, outside the
  timed path;
- ``--input memory``: the rank's block of the training split read whole into memory first and
  served from there, as the trainer fed itself before its input streamed (a tensor of the
  block, each batch gathered from it by index, a new order each epoch): `bench.input_pipeline`'s
  reference for what streaming costs.
"""

from __future__ import annotations

import functools
import json
import sys
import time
from pathlib import Path
from typing import Any

import click

from components.common.declare import run_command

SNAPSHOTS_FILE = "snapshots.json"


def _grouped(groups: int) -> None:
    import horovod.tensorflow.keras as hvd

    hvd.DistributedOptimizer = functools.partial(hvd.DistributedOptimizer, groups=groups)


def _adadelta() -> None:
    from components.common import keras_env
    from components.train.rank import trainer

    keras = keras_env.keras()

    def adadelta(**adam: Any) -> Any:  # Adam's settings: the learning rate is what it keeps
        return keras.optimizers.Adadelta(learning_rate=adam["learning_rate"])

    trainer.fused_adam = adadelta  # the name the trainer makes its optimizer by


def _in_memory() -> None:
    """The trainer's input from memory: its rank's block, decoded once into one tensor."""
    from components.common import keras_env
    from components.common.dataset import read_manifest
    from components.common.shard_files import read_split_arrays
    from components.train.rank import trainer
    from components.train.rank.data import batch_bounds

    def from_memory(tf: Any, plan: Any, seed: int, rank: int, epochs: range, threads: int) -> Any:
        import numpy as np

        manifest = read_manifest(trainer_data[0])
        x, y = read_split_arrays(keras_env.tensorflow(), manifest, "train")
        images, labels = (
            tf.constant(x[plan.start : plan.stop]),
            tf.constant(y[plan.start : plan.stop]),
        )
        bounds = batch_bounds(plan.samples, plan.steps)
        width = max(hi - lo for lo, hi in bounds)
        rows = np.zeros((len(epochs) * plan.steps, width), np.int64)
        lengths = np.zeros(len(epochs) * plan.steps, np.int64)
        for k, epoch in enumerate(epochs):
            order = np.random.default_rng([seed, epoch, rank]).permutation(plan.samples)
            for b, (lo, hi) in enumerate(bounds):
                rows[k * plan.steps + b, : hi - lo] = order[lo:hi]
                lengths[k * plan.steps + b] = hi - lo

        def gather(row: Any, length: Any) -> tuple[Any, Any]:
            return tf.gather(images, row[:length]), tf.gather(labels, row[:length])

        options = tf.data.Options()
        options.threading.private_threadpool_size = threads
        options.deterministic = True
        slices = tf.data.Dataset.from_tensor_slices((rows, lengths))
        return slices.map(gather).prefetch(2).with_options(options)

    trainer_data: list[str] = []
    plain_read = trainer.read_shard

    def read_shard(ctx: Any) -> Any:
        trainer_data[:] = [ctx.config.data]
        return plain_read(ctx)

    trainer.read_shard = read_shard
    trainer.make_dataset = from_memory


def snapshot_callback(keras: Any, out: Path, per_epoch: int, steps: int) -> Any:
    """Rank 0's weights `per_epoch` times an epoch of `steps` steps, each with its clocks."""
    marks = {max(1, round(steps * k / per_epoch)) for k in range(1, per_epoch + 1)}

    class Snapshots(keras.callbacks.Callback):  # type: ignore[misc, name-defined]
        def on_train_begin(self, logs: Any = None) -> None:
            self.first: float | None = None
            self.spent = 0.0
            self.records: list[dict[str, Any]] = []

        def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
            self.epoch = epoch

        def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
            if self.first is None:
                self.first = time.perf_counter()

        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            if batch + 1 not in marks or self.first is None:
                return
            started, wall = time.perf_counter(), time.time()
            path = out / f"e{self.epoch:03d}-b{batch + 1:04d}.weights.h5"
            self.model.save_weights(str(path))
            self.records.append({
                "epoch": self.epoch + (batch + 1) / steps, "weights": path.name,
                "training_seconds": started - self.first - self.spent,
                "wall_time": wall - self.spent,
            })  # fmt: skip
            (out / SNAPSHOTS_FILE).write_text(json.dumps(self.records))
            self.spent += time.perf_counter() - started

    return Snapshots()


def _snapshots(out: Path, per_epoch: int) -> None:
    from components.common import keras_env
    from components.train.rank import trainer

    keras, plain = keras_env.keras(), trainer.callbacks
    out.mkdir(parents=True, exist_ok=True)

    def with_snapshots(ctx: Any, trainee: Any, shard: Any) -> list[Any]:
        callbacks = plain(ctx, trainee, shard)
        if ctx.rank == 0:
            callbacks.append(snapshot_callback(keras, out, per_epoch, shard.steps))
        return callbacks

    trainer.callbacks = with_snapshots


@click.command(help=__doc__)
@click.option("--groups", type=int, default=0, show_default=True)
@click.option(
    "--optimizer", type=click.Choice(["adam", "adadelta"]), default="adam", show_default=True
)
@click.option("--snapshots", type=click.Path(file_okay=False, path_type=Path), default=None)
@click.option("--per-epoch", type=int, default=4, show_default=True)
@click.option(
    "--input",
    "source",
    type=click.Choice(["stream", "memory"]),
    default="stream",
    show_default=True,
)
@click.argument("trainer_args", nargs=-1, type=click.UNPROCESSED, metavar="-- TRAINER ARGS")
def command(
    groups: int,
    optimizer: str,
    snapshots: Path | None,
    per_epoch: int,
    source: str,
    trainer_args: tuple[str, ...],
) -> int:
    from components.common import keras_env
    from components.train.rank import cli

    keras_env.keras()  # Keras 3 on TensorFlow, checked before Horovod is imported (as the trainer)
    if groups:
        _grouped(groups)
    if optimizer == "adadelta":
        _adadelta()
    if snapshots is not None:
        _snapshots(snapshots, per_epoch)
    if source == "memory":
        _in_memory()
    return cli.main(list(trainer_args))


def main(argv: list[str] | None = None) -> int:
    """``python -m bench.variants [VARIANT OPTIONS] -- TRAINER ARGS``: the variants asked for,
    then this rank of the trainer."""
    return int(run_command(command, argv, "python -m bench.variants"))


if __name__ == "__main__":
    sys.exit(main())
