"""The Horovod training program: every rank of the job runs :func:`run`, Horovod's checklist from
top to bottom (the comment above `run` lists its steps). Runs in each rank, under mpirun (a
static job) or elastic horovodrun (`components.train.rank.elastic`).
"""

from __future__ import annotations

import logging
import os
import sys
import tempfile
import warnings
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from components.common import dataset, keras_env, storage, storage_access
from components.common.board import Board
from components.common.failure import ExitCode, ExpectedError
from components.common.model_files import SAVED_MODEL_PB, saved_model_sha256
from components.common.shard_files import ShardCheck, first_record_problem
from components.train.config import TrainConfig, adam_settings
from components.train.rank import checkpoints, held_input
from components.train.rank.adam import fused_adam
from components.train.rank.data import RankPlan, make_dataset, plan_rank
from components.train.rank.devices import Devices, configure_devices, gpu_problem
from components.train.rank.model import ModelChoiceError, build_model, export_saved_model
from components.train.rank.telemetry import Telemetry
from components.train.rank.world_size import world_size_problem
from components.train.summary import coordination_lines, lr_formula, write


class AllRanksError(ExpectedError):
    """An error every rank agreed on and raises together (none is left waiting in a
    collective); the job stops with `exit_code`."""


@dataclass
class RankContext:
    """This rank of the job: what every step of the checklist needs."""

    config: TrainConfig
    hvd: Any
    tf: Any
    log: logging.Logger
    devices: Devices
    workdir: Path
    telemetry: Telemetry = field(init=False)
    shards: ShardCheck = field(init=False)

    def __post_init__(self) -> None:
        uri = self.config.tensorboard_uri
        board = Board(self.tf, uri, "train", self.workdir) if self.rank == 0 else None
        self.telemetry = Telemetry(self.hvd, self.tf, self.devices, self.log, board)
        self.shards = ShardCheck()

    @cached_property
    def manifest(self) -> dataset.Manifest:
        """The dataset's manifest, read by this rank (DataError naming the file)."""
        return dataset.read_manifest(self.config.data)

    @property
    def rank(self) -> int:
        return int(self.hvd.rank())

    @property
    def size(self) -> int:
        return int(self.hvd.size())

    @property
    def adam(self) -> dict[str, float]:
        """Adam's settings for this world size under the job's ``lr_scaling`` rule."""
        return adam_settings(self.config.lr_scaling, self.config.learning_rate, self.size)


@dataclass
class Trainee:
    """The model being trained, its checkpoint, and the checkpoint a resumed run starts from."""

    model: Any
    ckpt: Any
    resume: checkpoints.CheckpointInfo | None

    @property
    def initial_epoch(self) -> int:
        return self.resume.epoch if self.resume else 0


# Horovod's checklist, as `run` and `train_static` follow it:
#
# 1. **Init**: ``hvd.init()``, then the preflight: the world size must be ``--workers`` x
#    ``--slots-per-worker`` (N copies of a world of 1 are not one job).
# 2. **Devices**: pin this rank to the GPU of its local rank (if any), set its CPU threads. A job
#    that asked for GPUs (``--gpus-per-worker``) and cannot have them stops before training.
# 3. **This rank's shard**: a disjoint block of the training split, streamed from the dataset's
#    shard files (`components.train.rank.data`); every rank learns whether any rank failed, the GPU
#    check included, before anyone trains.
# 4. **Model**: for the dataset's image shape and classes, the same initial weights on every rank
#    (from the seed), or rank 0's latest checkpoint, which every rank restores.
# 5. **Optimizer**: Adam at the ``lr_scaling`` rule's learning rate (``linear``: lr x size), wrapped
#    in ``hvd.DistributedOptimizer``: gradients averaged every step.
# 6. **Callbacks**: Horovod's ``BroadcastGlobalVariablesCallback(0)`` (rank 0's state to all),
#    ``MetricAverageCallback`` and ``LearningRateWarmupCallback``; the run's telemetry
#    (`components.train.rank.telemetry`); rank 0 alone checkpoints after every epoch.
# 7. **Fit**, every rank the same number of steps.
# 8. **Export**: rank 0 alone writes the one SavedModel and the run summary.
#
# An elastic job (``--min-workers`` > 0) runs steps 3, 6 and 7 inside Horovod's elastic loop
# (`components.train.rank.elastic`).
def run(config: TrainConfig, train: Callable[[RankContext], int] | None = None) -> int:
    """Run this rank's part of the job (`train`: the elastic loop, else `train_static`).
    Returns the process exit code."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    try:
        keras_env.keras()  # Keras 3 on TensorFlow, or one line saying why not
    except keras_env.KerasSetupError as exc:  # (the launcher's preflight says it first)
        if os.environ.get("OMPI_COMM_WORLD_RANK", os.environ.get("HOROVOD_RANK", "0")) == "0":
            sys.stderr.write(f"training failed: {exc}\n")  # one line, not one per rank
        return ExitCode.BAD_INPUT
    import horovod.tensorflow.keras as hvd
    import tensorflow as tf

    # 1. Init: one job of the size asked for.
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    log = rank_logger(rank, size)
    # TF's and Python's warnings from rank 0 only (one copy, not one per rank), without the
    # first-step callback-timing note.
    if rank != 0:
        warnings.simplefilter("ignore")
    tf_logger = tf.get_logger()
    tf_logger.setLevel(logging.WARNING if rank == 0 else logging.ERROR)
    tf_logger.addFilter(lambda record: "compared to the batch time" not in record.getMessage())
    fewest = config.min_world_size if config.elastic else 0
    problem = world_size_problem(size, config.world_size, rank, fewest)
    if problem:
        sys.stderr.write(problem + "\n")  # one write: mpirun tags each chunk a rank writes
        sys.stderr.flush()
        return ExitCode.PREFLIGHT
    # 2. Devices: this rank's GPU (by local rank) or the CPU, and its threads.
    quiet = rank != 0
    threads = config.threads_per_worker
    devices = configure_devices(tf, hvd.local_rank(), hvd.local_size(), threads, quiet=quiet)
    try:
        with tempfile.TemporaryDirectory(prefix="kfp-horovod-") as workdir:
            return (train or train_static)(
                RankContext(config, hvd, tf, log, devices, Path(workdir))
            )
    except AllRanksError as exc:
        if rank == 0:
            log.error("training failed: %s", exc)
        return exc.exit_code


def train_static(ctx: RankContext) -> int:
    """Steps 3 to 8 of the checklist, for a job of a fixed size."""
    plan = agree_to_train(ctx)
    trainee = build_or_resume(ctx)
    metrics = fit(ctx, trainee, plan, callbacks(ctx, trainee, plan), trainee.initial_epoch)
    if not metrics and trainee.resume:
        metrics = dict(trainee.resume.metrics)
    return export(ctx, trainee, plan, metrics, trainee.initial_epoch)


# 3. This rank's shard ------------------------------------------------------------------------


def agree_to_train(ctx: RankContext) -> RankPlan:
    """This rank's shard, once every rank has found it can train (`devices_problem`,
    `read_shard`, `exported_model_problem`): every rank learns whether any rank failed before
    anyone trains (an AllRanksError on every rank, rank 0 saying why)."""
    from horovod.tensorflow import allgather_object

    shard: RankPlan | None = None
    error = devices_problem(ctx)
    if error is None:
        try:
            shard = read_shard(ctx)
            error = exported_model_problem(ctx)
        except (dataset.DataError, ValueError) as exc:
            error = str(exc)
    errors = allgather_object(error)  # nobody waits for a rank that gave up
    if any(errors):
        first = next(e for e in errors if e)
        if error and error != first:  # rank 0 reports `first` once, for every rank that shares it
            ctx.log.error("cannot train: %s", error)
        failed = sum(1 for e in errors if e)
        raise AllRanksError(f"{failed} of {ctx.size} ranks cannot train: {first}")
    assert shard is not None
    _log_plan(ctx, shard)
    return shard


def devices_problem(ctx: RankContext) -> str | None:
    """Why this rank cannot train on the GPUs the job asked for, or None: a job that asked for
    GPUs trains on them or not at all."""
    if ctx.config.gpus_per_worker <= 0:
        return None
    from components.train.rank.cuda import missing_cuda_libraries

    local_size, found = int(ctx.hvd.local_size()), ctx.devices.gpus_found
    missing = list(missing_cuda_libraries())
    return gpu_problem(ctx.config.gpus_per_worker, local_size, found, missing)


def read_shard(ctx: RankContext) -> RankPlan:
    """This rank's shard of the training split, planned once the workers' identity is found to
    read the data (rank 0: and to write where the job does), each of its shard files found (a
    local one's sha256 checked) and its first record found to hold what the manifest says;
    DataError or ValueError says why not."""
    config = ctx.config
    storage_access.check_job(config, writes=ctx.rank == 0)
    plan = plan_rank(ctx.manifest, config.batch_size_per_worker, ctx.rank, ctx.size)
    for piece in plan.pieces:
        ctx.shards.check(piece.uri, piece.sha256)
    with ThreadPoolExecutor(max_workers=8) as pool:  # a GCS shard's first record: one request
        problems = pool.map(
            lambda p: first_record_problem(p.uri, p.sha256, plan.image, len(plan.classes)),
            plan.pieces,
        )
        problem = next((found for found in problems if found), None)
    if problem:
        raise dataset.DataError(problem)
    return plan


def exported_model_problem(ctx: RankContext) -> str | None:
    """On rank 0, why the job must not train: a model is already exported at its model URI."""
    uri = ctx.config.model_uri
    if ctx.rank == 0 and storage.exists(storage.join(uri, SAVED_MODEL_PB)):
        return f"{uri}: a model is already exported there; refusing to overwrite"
    return None


# 4. Model and 5. optimizer -------------------------------------------------------------------


def build_or_resume(ctx: RankContext) -> Trainee:
    """Build the model with its optimizer; rank 0 finds the latest checkpoint and broadcasts it
    (an elastic job: every rank reads it, no collective before its loop); every rank restores."""
    from horovod.tensorflow import broadcast_object

    config = ctx.config
    resume: checkpoints.CheckpointInfo | str | None = None
    if ctx.rank == 0 or config.elastic:
        try:
            resume = checkpoints.latest(config.checkpoint_uri, ctx.log, ctx.workdir)
        except checkpoints.CheckpointError as exc:  # committed, none usable: never start over
            resume = str(exc)
    if not config.elastic:
        resume = broadcast_object(resume, root_rank=0)
    if isinstance(resume, str):  # every rank learns it: every rank stops here
        raise AllRanksError(resume)
    problem = resume.resume_problem(config.model, config.checkpoint_uri) if resume else None
    # Mixed precision: the model's layers compute in float16 (their weights stay float32).
    policy = "mixed_float16" if config.mixed_precision else "float32"
    keras_env.keras().mixed_precision.set_global_policy(policy)
    try:
        if problem:  # every rank has the same marker: every rank stops here
            raise ModelChoiceError(problem)
        image, classes = ctx.manifest.image, ctx.manifest.classes
        model = build_model(config.seed, config.model, config.augment, image.shape, len(classes))
    except ModelChoiceError as exc:  # every rank builds the same: every rank stops here
        raise AllRanksError(str(exc)) from exc
    ctx.log.info(
        "model %s: %s parameters; augmentation %s",
        config.model,
        f"{model.count_params():,}",
        "on (training only)" if config.augment else "off",
    )
    optimizer = distributed_optimizer(ctx)
    # No XLA: the Horovod build has no XLA kernels (make/horovod/patches/0001), and Keras 3's
    # "auto" picks XLA wherever a GPU is.
    model.compile(
        optimizer=optimizer,
        loss="sparse_categorical_crossentropy",
        metrics=["accuracy"],
        jit_compile=False,
    )
    # Built now, not in the first step: a checkpoint restores every slot, and the broadcast (or
    # the elastic state) covers them.
    optimizer.build(model.trainable_variables)
    ckpt = checkpoints.new_checkpoint(model, optimizer)
    if resume:
        try:
            checkpoints.restore(ckpt, config.checkpoint_uri, resume, ctx.workdir)
        except checkpoints.CheckpointError as exc:  # every rank restores: every rank stops
            raise AllRanksError(str(exc)) from exc
        ctx.log.info("resuming from checkpoint after epoch %d of %d", resume.epoch, config.epochs)
    return Trainee(model, ckpt, resume)


def distributed_optimizer(ctx: RankContext) -> Any:
    """Adam at this world size's settings, in Horovod's DistributedOptimizer (which averages
    the gradients every step), its allreduce timed by the telemetry. Mixed precision: Adam in
    Keras's LossScaleOptimizer, whose skip of an overflowed step every rank takes alike (the
    gradients are averaged before its check: make/horovod/patches/0003)."""
    optimizer = fused_adam(**ctx.adam)
    if ctx.config.mixed_precision:
        optimizer = keras_env.keras().optimizers.LossScaleOptimizer(optimizer)
    return ctx.telemetry.clock.wrap(ctx.hvd.DistributedOptimizer(optimizer))


# 6. Callbacks --------------------------------------------------------------------------------


def callbacks(ctx: RankContext, trainee: Trainee, shard: RankPlan) -> list[Any]:
    """Horovod's broadcast, metric averaging and warmup; the telemetry; rank 0's checkpoints.

    An elastic job has no broadcast callback: its state's sync broadcasts rank 0's weights at
    the start of every attempt.
    """
    hvd, config, keras = ctx.hvd, ctx.config, keras_env.keras()
    telemetry = ctx.telemetry
    # The telemetry keeps each rank's own metrics before they are averaged, and checks after.
    found: list[Any] = [
        telemetry.own_metrics_callback(keras),
        hvd.callbacks.MetricAverageCallback(),
    ]
    if not config.elastic:
        found.insert(0, hvd.callbacks.BroadcastGlobalVariablesCallback(0))
    if config.warmup_epochs > 0:
        found.append(
            hvd.callbacks.LearningRateWarmupCallback(
                initial_lr=ctx.adam["learning_rate"],
                warmup_epochs=config.warmup_epochs,
                steps_per_epoch=shard.steps,
            )
        )
    found.append(telemetry.callback(keras, shard, config.epochs))
    # no wait for tf.data at the end of fit; the telemetry times each step's wait for its batch
    found.append(held_input.hold_callback(keras, telemetry.input_clock))
    if ctx.rank == 0:
        saver = checkpoints.Saver(trainee.ckpt, config.checkpoint_uri, ctx.workdir)

        def checkpoint(epoch: int, logs: Any) -> None:
            metrics = {k: float(v) for k, v in (logs or {}).items() if k != "lr"}
            saver.save(epoch + 1, metrics, config.model)
            ctx.log.info(
                "checkpoint after epoch %d written to %s", epoch + 1, config.checkpoint_uri
            )

        found.append(keras.callbacks.LambdaCallback(on_epoch_end=checkpoint))
    return found


# 7. Fit --------------------------------------------------------------------------------------


def fit(
    ctx: RankContext, trainee: Trainee, shard: RankPlan, with_callbacks: list[Any], start: int
) -> dict[str, float]:
    """Train the epochs after `start`; the last epoch's metrics ({} if none were left)."""
    config = ctx.config
    if start >= config.epochs:
        ctx.log.info("the checkpoint already covers all %d epochs; exporting it", config.epochs)
        return {}
    epochs = range(start, config.epochs)
    threads = ctx.devices.threads
    data = make_dataset(ctx.tf, shard, config.seed, ctx.rank, epochs, threads)
    history = trainee.model.fit(
        data,
        epochs=config.epochs,
        initial_epoch=start,
        steps_per_epoch=shard.steps,
        callbacks=with_callbacks,
        verbose=0,
        shuffle=False,  # `data` shuffles each epoch itself
    )
    return {k: float(v[-1]) for k, v in history.history.items() if k != "lr"}


# 8. Export -----------------------------------------------------------------------------------


def export(
    ctx: RankContext,
    trainee: Trainee,
    shard: RankPlan,
    metrics: dict[str, float],
    epoch: int,
    **extra: Any,
) -> int:
    """Every rank shares what it did; rank 0 exports the one model and the run summary (with
    `extra`'s fields: an elastic job's)."""
    config = ctx.config
    summary = ctx.telemetry.run_summary(
        config,
        shard,
        trainee.model,
        resumed_from_epoch=trainee.initial_epoch,
        adam=ctx.adam,
        final_metrics=metrics,
    )
    if summary is None:  # not rank 0
        return ExitCode.OK
    for name, value in extra.items():
        setattr(summary, name, value)
    summary.saved_model_sha256 = save_model(trainee.model, config.model_uri, ctx.manifest)
    write(config.summary_uri, summary)
    for line in coordination_lines(summary):
        ctx.log.info("%s", line)
    return ExitCode.OK


def save_model(model: Any, model_uri: str, manifest: dataset.Manifest) -> str:
    """Rank 0 writes the one SavedModel for the dataset's images and classes (no optimizer: it
    loads without Horovod); the sha256 of its ``saved_model.pb``."""
    with tempfile.TemporaryDirectory(prefix="export-") as tmp:
        local = Path(tmp) / "model"
        export_saved_model(model, local, manifest.image, manifest.classes)
        pb_sha256 = saved_model_sha256(local)
        storage.upload_dir(local, model_uri, last=SAVED_MODEL_PB)
    return pb_sha256


# The rank's log ------------------------------------------------------------------------------


def rank_logger(rank: int, size: int) -> logging.Logger:
    """The trainer's logger, its lines tagged ``[rank r/size]``; only rank 0 logs below WARNING.

    Calling it again relabels the same logger (an elastic job's ranks change on a reset).
    """
    logger = logging.getLogger("kfp_horovod.trainer")
    logger.handlers.clear()
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(logging.Formatter(f"[rank {rank}/{size}] %(message)s"))
    logger.addHandler(handler)
    logger.setLevel(logging.INFO if rank == 0 else logging.WARNING)
    logger.propagate = False
    return logger


def _log_plan(ctx: RankContext, shard: RankPlan) -> None:
    """Rank 0 says, in plain words, what the job is about to do."""
    config, size, hvd = ctx.config, ctx.size, ctx.hvd
    lr = lr_formula(config.lr_scaling, config.learning_rate, size, ctx.adam["learning_rate"])
    ctx.log.info(
        "ONE Horovod job: %d workers (%s local per host, formed by the %s controller) train ONE "
        "model together. Each rank reads a disjoint 1/%d of the %d training samples and runs %d "
        "steps per epoch; gradients are averaged every step; rank 0 alone logs, checkpoints and "
        "exports.",
        size,
        hvd.local_size(),
        "mpi" if hvd.mpi_enabled() else "gloo",
        size,
        shard.total,
        shard.steps,
    )
    ctx.log.info(
        "global batch %d = %d workers x %d; learning rate %s, warmed up over %d epoch(s); "
        "device %s, %d thread(s) per worker",
        config.batch_size_per_worker * size,
        size,
        config.batch_size_per_worker,
        lr,
        config.warmup_epochs,
        ctx.devices.device,
        ctx.devices.threads,
    )
    classes = shard.classes
    named = ", ".join(classes[:5]) + (f", … ({len(classes)} in all)" if len(classes) > 5 else "")
    ctx.log.info(
        "data: %s images of %d classes (%s), streamed from %d shard file(s) of the train split",
        shard.image.describe(),
        len(classes),
        named,
        len(ctx.manifest.shards("train")),
    )
