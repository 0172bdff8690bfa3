"""Elastic training (``min_workers`` > 0): the job survives losing workers, and grows back. Runs in
each rank, inside Horovod's elastic loop (``hvd.elastic.run``), under elastic horovodrun.
"""

from __future__ import annotations

import os
import time
from typing import Any

from components.common import keras_env
from components.train.rank import trainer
from components.train.rank.data import coverage
from components.train.rank.gloo_timeout import GLOO_TIMEOUT_ENV, JOIN_GLOO_TIMEOUT_S
from components.train.rank.trainer import RankContext, Trainee

# Every rank runs the trainer's own steps inside the elastic loop, with the model, the optimizer,
# the epoch, the last metrics and the job's records in a ``KerasState``. It commits once per epoch,
# after rank 0's checkpoint; a commit also raises ``HostsUpdatedInterrupt`` when hosts changed, so a
# job grows only at an epoch boundary. A lost worker fails the survivors' next collective: Horovod
# restores the last commit, forms a new world and calls `on_reset`; the interrupted epoch runs again
# from its start. Every attempt re-shards for its world size, re-scales Adam, and records each
# epoch's coverage (uncommitted records roll back with the state). The run summary records the
# world-size history.
#
# Nothing may run a collective before the elastic loop: a worker that joins later runs this module
# from the start while the others wait in the loop's sync. So every rank finds (and downloads) the
# latest checkpoint itself and the shards are read and agreed on inside each attempt; the rank 0 of
# each attempt checkpoints from the state file at the checkpoint location.
#
# Larger than any job's step count: Horovod's CommitStateCallback then commits at epoch ends
# only, so an epoch never straddles two world sizes.
COMMIT_AT_EPOCH_ENDS_ONLY = 2**62


def world_entry(epoch: int, size: int, why: str) -> dict[str, Any]:
    when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    return {"epoch": epoch, "world_size": size, "when": when, "why": why}


def train_elastic(ctx: RankContext) -> int:
    """Build (maybe resume) the model, train it elastically, export the one model."""
    from horovod.common.exceptions import HostsUpdatedInterrupt

    hvd, config = ctx.hvd, ctx.config
    # Gloo reads its timeout at each reset: the job's (the launcher's bound on a lost rank's
    # stall) after a loss, Horovod's default before a join, whose worker starts only then.
    bound = os.environ.get(GLOO_TIMEOUT_ENV)
    trainee = trainer.build_or_resume(ctx)
    start = "resumed from the checkpoint" if trainee.resume else "start"
    state = hvd.elastic.KerasState(
        trainee.model,
        trainee.model.optimizer,
        epoch=trainee.initial_epoch,
        metrics=dict(trainee.resume.metrics) if trainee.resume else {},
        history=[world_entry(trainee.initial_epoch, ctx.size, start)],
        epochs=[],
    )
    why = ["start"]

    def on_reset() -> None:
        trainer.rank_logger(ctx.rank, ctx.size)  # relabel this rank's lines
        state.history = [*state.history, world_entry(state.epoch, ctx.size, why[0])]
        state.save()  # else the sync that follows puts back the history of the last commit
        ctx.log.info(
            "elastic: %s; the job goes on as ONE job of %d workers from epoch %d of %d",
            why[0],
            ctx.size,
            state.epoch + 1,
            config.epochs,
        )

    state.register_reset_callbacks([on_reset])

    @hvd.elastic.run  # type: ignore[misc]
    def attempt(state: Any) -> tuple[Any, int]:
        try:
            return _attempt(ctx, trainee, state)
        except HostsUpdatedInterrupt:
            why[0] = "the hosts changed (host discovery)"
            if bound is not None:
                os.environ[GLOO_TIMEOUT_ENV] = str(JOIN_GLOO_TIMEOUT_S)
            raise
        except Exception:  # Horovod resets only on its own errors (a failed collective)
            why[0] = "a worker was lost (a collective failed)"
            if bound is not None:
                os.environ[GLOO_TIMEOUT_ENV] = bound
            raise

    shard, first = attempt(state)
    record = {
        "min_workers": config.min_workers,
        "max_workers": config.workers,
        "world_size_history": list(state.history),
        "epochs": list(state.epochs),
    }
    extra: dict[str, Any] = {"elastic": record}
    if state.epochs:  # the coverage of every epoch this job trained, each at its world size
        epochs = state.epochs
        extra["coverage"] = {
            "samples": shard.total,
            "seen_per_epoch": epochs[-1]["seen_per_epoch"],
            "disjoint": all(e["disjoint"] for e in epochs),
            "covers_all": all(e["covers_all"] for e in epochs),
            "epochs_checked": len(epochs),
        }
    return trainer.export(ctx, trainee, shard, dict(state.metrics), first, **extra)


def _attempt(ctx: RankContext, trainee: Trainee, state: Any) -> tuple[Any, int]:
    """One attempt at the epochs left in the world as it is now; the static job's callbacks
    and fit, the state's own after them."""
    from horovod.tensorflow import allgather_object

    shard = trainer.agree_to_train(ctx)
    optimizer, start = trainee.model.optimizer, state.epoch
    adam = ctx.adam
    if start < ctx.config.warmup_epochs:  # warmup sets the learning rate itself until then
        adam["learning_rate"] = float(optimizer.learning_rate.numpy())
    for name, value in adam.items():  # this world size's settings (lr_scaling)
        setattr(optimizer, name, value)
    # Keras 3's compiled step read beta_1, beta_2 and epsilon as constants: traced anew.
    trainee.model.make_train_function(force=True)
    keras = keras_env.keras()

    def record_epoch(epoch: int, logs: Any) -> None:
        blocks = allgather_object((shard.start, shard.stop))
        entry = {"epoch": epoch + 1, "world_size": ctx.size, **coverage(blocks, shard.total)}
        # Assign, never mutate: KerasState keeps the committed values by reference.
        state.epochs = [*state.epochs, entry]
        state.metrics = {k: float(v) for k, v in (logs or {}).items() if k != "lr"}
        state.epoch = epoch + 1

    commit = ctx.hvd.elastic.CommitStateCallback(state, COMMIT_AT_EPOCH_ENDS_ONLY)
    found = [
        *trainer.callbacks(ctx, trainee, shard),
        keras.callbacks.LambdaCallback(on_epoch_end=record_epoch),
        commit,
    ]
    trainer.fit(ctx, trainee, shard, found, start)
    return shard, start
