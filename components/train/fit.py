"""The fit room: build (or resume) the model with Horovod's DistributedOptimizer, the callbacks
of the Horovod checklist and ours, and the fit itself.

Horovod's callbacks broadcast rank 0's state, average the metrics and warm the learning rate
up; ours time every epoch (`resources`), log progress and write TensorBoard scalars (rank 0),
and checkpoint (rank 0).
"""

from __future__ import annotations

import logging
from dataclasses import asdict
from typing import Any

import numpy as np

from components.common import keras_env
from components.common.board import Board
from components.train import checkpoints
from components.train.data import EpochPlan, Shard, make_dataset
from components.train.job import Job, JobError, Trainee
from components.train.model import ModelChoiceError, build_model, count_parameters
from components.train.resources import AllreduceClock, EpochCost, EpochTimer, step_split


def build_or_resume(job: Job) -> Trainee:
    """Build the model; rank 0 finds the latest checkpoint, broadcasts it, every rank restores."""
    from horovod.tensorflow import broadcast_object

    config, tf = job.config, job.tf
    reader = job.rank == 0 or config.elastic  # elastic: no collective before its loop starts
    resume: checkpoints.CheckpointInfo | str | None = None
    if reader:
        try:
            resume = checkpoints.latest(config.checkpoint_uri, job.log)
        except checkpoints.CheckpointError as exc:  # committed, none usable: never start over
            resume = str(exc)
    if not config.elastic:
        resume = broadcast_object(resume, root_rank=0)
    if isinstance(resume, str):  # every rank learns it: every rank stops here
        raise JobError(resume)
    problem = resume.model_problem(config.model, config.checkpoint_uri) if resume else None
    if problem:  # every rank has the same marker: every rank stops here
        raise JobError(problem)
    try:
        model = build_model(config.seed, config.model, config.augment)
    except ModelChoiceError as exc:  # every rank builds the same: every rank stops here
        raise JobError(str(exc)) from exc
    augmentation = "on (training only)" if config.augment else "off"
    job.log.info(
        "model %s: %s parameters; augmentation %s",
        config.model, f"{count_parameters(model):,}", augmentation,
    )  # fmt: skip
    keras = keras_env.keras()
    clock = AllreduceClock(tf)
    adam = keras.optimizers.legacy.Adam(**asdict(job.adam))
    optimizer = clock.wrap(job.hvd.DistributedOptimizer(adam))
    model.compile(optimizer=optimizer, loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    ckpt = tf.train.Checkpoint(model=model, optimizer=optimizer)
    if resume:
        checkpoints.restore(ckpt, config.checkpoint_uri, resume, job.workdir)
        job.log.info("resuming from checkpoint after epoch %d of %d", resume.epoch, config.epochs)
    return Trainee(model, ckpt, resume, clock)


def training_callbacks(job: Job, trainee: Trainee, steps: int, stats: EpochStats) -> list[Any]:
    """Horovod's broadcast, metric averaging and warmup; our stats (every rank), progress,
    TensorBoard and checkpoints (rank 0).

    An elastic job has no broadcast callback: its state's sync broadcasts rank 0's weights at
    the start of every attempt.
    """
    hvd, config = job.hvd, job.config
    keras = keras_env.keras()
    callbacks: list[Any] = [hvd.callbacks.MetricAverageCallback()]
    if not config.elastic:
        callbacks.insert(0, hvd.callbacks.BroadcastGlobalVariablesCallback(0))
    if config.warmup_epochs > 0:
        callbacks.append(
            hvd.callbacks.LearningRateWarmupCallback(
                initial_lr=job.scaled_lr, warmup_epochs=config.warmup_epochs, steps_per_epoch=steps
            )
        )
    callbacks.append(_make_stats_callback(keras, job, trainee.clock, steps, stats))
    if job.rank == 0:
        callbacks.append(_make_progress_callback(keras, job.log, config.epochs, job.size, stats))
        board = Board(job.tf, config.tensorboard_uri, "train", job.workdir)
        callbacks.append(_make_board_callback(keras, board, stats))
        callbacks.append(
            _make_checkpoint_callback(
                keras, trainee.ckpt, config.checkpoint_uri, config.model, job.log
            )
        )
    return callbacks


class EpochStats:
    """This rank's epoch timings and every rank's `EpochCost` per epoch (gathered each epoch);
    examples/s excludes the first (warm-up) epoch when possible."""

    def __init__(self, samples_per_epoch: int) -> None:
        self.samples_per_epoch = samples_per_epoch
        self.seconds: list[float] = []
        self.costs: list[list[EpochCost]] = []

    def examples_per_second(self) -> float:
        timed = self.seconds[1:] or self.seconds
        if not timed:
            return 0.0
        return round(self.samples_per_epoch / float(np.median(timed)), 1)

    def last_epoch(self) -> dict[str, float]:
        """The last epoch of the whole job: its step split and the job's examples/s (every
        rank's samples over the slowest rank's epoch)."""
        costs = self.costs[-1]
        slowest = max(c.seconds for c in costs)
        rate = self.samples_per_epoch * len(costs) / slowest if slowest > 0 else 0.0
        return {**step_split(costs), "examples_per_second": rate}


def _make_stats_callback(
    keras: Any, job: Job, clock: AllreduceClock, steps: int, stats: EpochStats
) -> Any:
    from horovod.tensorflow import allgather_object

    timer = EpochTimer()

    class StatsCallback(keras.callbacks.Callback):  # type: ignore[misc, name-defined]
        def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
            timer.start()

        def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
            cost = timer.stop(job.rank, steps, clock.take(), job.threads)
            stats.seconds.append(cost.seconds)
            stats.costs.append(list(allgather_object(cost)))  # every rank, every epoch

    return StatsCallback()


def _make_progress_callback(
    keras: Any, log: logging.Logger, epochs: int, size: int, stats: EpochStats
) -> Any:
    class ProgressCallback(keras.callbacks.Callback):  # type: ignore[misc, name-defined]
        def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
            logs = logs or {}
            lr = float(keras.backend.get_value(self.model.optimizer.lr))
            job = stats.last_epoch()
            log.info(
                "Epoch %d/%d - loss %.4f - accuracy %.4f (averaged over %d ranks) - lr %.5f - "
                "%.0f examples/s - a step: compute %.0f%%, communication %.0f%%, waiting %.0f%%",
                epoch + 1,
                epochs,
                logs.get("loss", float("nan")),
                logs.get("accuracy", float("nan")),
                size,
                lr,
                job["examples_per_second"],
                100 * job["compute_share"],
                100 * job["communication_share"],
                100 * job["waiting_share"],
            )

    return ProgressCallback()


def _make_board_callback(keras: Any, board: Board, stats: EpochStats) -> Any:
    class BoardCallback(keras.callbacks.Callback):  # type: ignore[misc, name-defined]
        def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
            logs = logs or {}
            scalars = {k: float(logs[k]) for k in ("loss", "accuracy") if k in logs}
            scalars["learning_rate"] = float(keras.backend.get_value(self.model.optimizer.lr))
            scalars.update(stats.last_epoch())
            scalars.pop("step_seconds")
            board.write(epoch + 1, scalars)

    return BoardCallback()


def _make_checkpoint_callback(
    keras: Any, ckpt: Any, checkpoint_uri: str, model: str, log: logging.Logger
) -> Any:
    class CheckpointCallback(keras.callbacks.Callback):  # type: ignore[misc, name-defined]
        def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
            metrics = {k: float(v) for k, v in (logs or {}).items() if k != "lr"}
            checkpoints.save(ckpt, checkpoint_uri, epoch + 1, metrics, model)
            log.info("checkpoint after epoch %d written to %s", epoch + 1, checkpoint_uri)

    return CheckpointCallback()


def fit_epochs(
    job: Job, trainee: Trainee, shard: Shard, plan: EpochPlan, callbacks: list[Any]
) -> dict[str, float]:
    """Train the epochs of `plan`; the last epoch's metrics ({} if none were left)."""
    config = job.config
    if plan.start >= config.epochs:
        job.log.info("the checkpoint already covers all %d epochs; exporting it", config.epochs)
        return {}
    history = trainee.model.fit(
        make_dataset(job.tf, shard, plan.rows, plan.lengths, job.threads),
        epochs=config.epochs,
        initial_epoch=plan.start,
        steps_per_epoch=shard.steps,
        callbacks=callbacks,
        verbose=0,
    )
    return {k: float(v[-1]) for k, v in history.history.items() if k != "lr"}
