"""The Horovod training program: every rank of the job runs :func:`run`.

What each rank does, in order:

1. ``hvd.init()`` and the preflight: the world size must equal ``--expected-workers``.
2. Pin itself to one GPU by local rank (if any) and set its CPU thread count. A job that asked
   for GPUs (``--gpus-per-worker``) and cannot have them stops here (`devices.gpu_problem`).
3. Read only its own disjoint shard of the training split (all ranks agree on any error, the
   GPU one included).
4. Build the chosen model (``--model``: the same initial weights on every rank, from the
   seed) and train it with ``hvd.DistributedOptimizer`` (gradients averaged every step), the
   learning rate scaled by world size with warmup, state broadcast from rank 0 and metrics
   averaged (Horovod's own callbacks). Rank 0 alone prints progress and writes one checkpoint
   per epoch.
5. Gather what every rank did; rank 0 exports the single SavedModel and ``run_summary.json``.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from components.common import dataset, keras_env, storage
from components.train import checkpoints
from components.train.config import TrainConfig
from components.train.devices import Devices, configure_devices, gpu_problem, gpu_usage
from components.train.model import (
    ModelChoiceError,
    build_model,
    count_parameters,
    weights_fingerprint,
)
from components.train.preflight import EXIT_PREFLIGHT, world_size_problem
from components.train.report import device_text, world_history
from components.train.sharding import batch_bounds, epoch_permutation, shard_range, steps_per_epoch

EXIT_OK = 0
EXIT_BAD_INPUT = 2
SUMMARY_KIND = "kfp-horovod/run-summary/v1"


class JobError(RuntimeError):
    """An error every rank agreed on; the job stops with `exit_code`."""

    def __init__(self, message: str, exit_code: int = EXIT_BAD_INPUT) -> None:
        super().__init__(message)
        self.exit_code = exit_code


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


@dataclass
class Shard:
    """This rank's part of the training split."""

    images: np.ndarray
    labels: np.ndarray
    start: int
    stop: int
    steps: int
    total: int
    manifest_sha256: str


def load_shard(config: TrainConfig, rank: int, size: int) -> Shard:
    """Read this rank's disjoint block of the training split. Raises DataError naming the file."""
    manifest = dataset.read_manifest(config.data)
    total = manifest.count("train")
    start, stop = shard_range(total, rank, size)
    if stop <= start:
        raise dataset.DataError(
            f"{config.data}: the train split has {total} samples, so rank {rank} of {size} gets "
            "an empty shard; use fewer workers or more data"
        )
    steps = steps_per_epoch(total, size, config.batch_size_per_worker)
    try:
        batch_bounds(stop - start, steps)
    except ValueError as exc:
        raise dataset.DataError(f"{config.data}: {exc}") from exc
    images, labels = dataset.load_range(manifest, "train", start, stop)
    return Shard(images, labels, start, stop, steps, total, manifest.sha256)


def epoch_batches(
    shard: Shard, seed: int, rank: int, epochs: range
) -> tuple[np.ndarray, np.ndarray]:
    """Every batch of `epochs` as rows of shard-local sample indices, padded, plus their lengths.

    Epoch ``e`` visits the shard in the order ``epoch_permutation(n, seed, e, rank)``, cut into
    ``shard.steps`` consecutive batches by ``batch_bounds``: each sample once per epoch.
    """
    n = len(shard.labels)
    bounds = batch_bounds(n, shard.steps)
    width = max(hi - lo for lo, hi in bounds)
    rows = np.zeros((len(epochs) * shard.steps, width), np.int64)
    lengths = np.zeros(len(epochs) * shard.steps, np.int64)
    for k, epoch in enumerate(epochs):
        order = epoch_permutation(n, seed, epoch, rank)
        for b, (lo, hi) in enumerate(bounds):
            rows[k * shard.steps + b, : hi - lo] = order[lo:hi]
            lengths[k * shard.steps + b] = hi - lo
    return rows, lengths


def make_dataset(tf: Any, shard: Shard, rows: np.ndarray, lengths: np.ndarray, threads: int) -> Any:
    """A ``tf.data`` pipeline serving those batches in order, gathered inside TensorFlow.

    It replaced a Keras ``Sequence`` (numpy indexing in Python) after the input-pipeline
    benchmark measured the Sequence 1.29x slower in one process (bench/README.md).
    """
    images = tf.constant(shard.images)
    labels = tf.constant(shard.labels)

    def gather(row: Any, length: Any) -> tuple[Any, Any]:
        picked = row[:length]
        return tf.gather(images, picked), tf.gather(labels, picked)

    options = tf.data.Options()
    options.threading.private_threadpool_size = threads  # stay within this rank's share
    options.deterministic = True
    return (
        tf.data.Dataset.from_tensor_slices((rows, lengths))
        .map(gather)
        .prefetch(2)
        .with_options(options)
    )


def _quiet_tensorflow(tf: Any, rank: int) -> None:
    """TF's and Python's warnings only from rank 0 (one copy, not one per rank), without the
    first-step callback-timing note."""
    if rank != 0:
        warnings.simplefilter("ignore")
    tf_logger = tf.get_logger()
    tf_logger.setLevel(logging.WARNING if rank == 0 else logging.ERROR)
    tf_logger.addFilter(lambda record: "compared to the batch time" not in record.getMessage())


def controller(hvd: Any) -> str:
    """Which Horovod controller formed the job: ``mpi`` (mpirun) or ``gloo`` (horovodrun)."""
    return "mpi" if hvd.mpi_enabled() else "gloo"


def _agree(error: str | None) -> list[str | None]:
    """Every rank learns every rank's error (or None): nobody waits for a rank that gave up."""
    from horovod.tensorflow import allgather_object

    return list(allgather_object(error))


@dataclass(frozen=True)
class Sampling:
    """Which samples a rank loads, and the batches it draws from them each epoch.

    The project's strategy is `DISJOINT`; ``bench/sampling_2019.py`` passes the 2019 example's.
    """

    load: Callable[[TrainConfig, int, int], Shard]
    batches: Callable[[Shard, int, int, range], tuple[np.ndarray, np.ndarray]]


DISJOINT = Sampling(load=load_shard, batches=epoch_batches)


def run(config: TrainConfig, sampling: Sampling = DISJOINT) -> int:
    """Run this rank's part of the job. Returns the process exit code."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    keras_env.keras()  # first: Keras 2 and the `keras` alias, before Horovod loads (issue 12)
    import horovod.tensorflow.keras as hvd
    import tensorflow as tf

    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    log = rank_logger(rank, size)
    _quiet_tensorflow(tf, rank)

    fewest = config.min_world_size if config.elastic else 0
    problem = world_size_problem(size, config.world_size, rank, fewest)
    if problem:
        print(problem, file=sys.stderr, flush=True)
        return EXIT_PREFLIGHT

    devices = configure_devices(
        tf, hvd.local_rank(), hvd.local_size(), config.threads_per_worker, config.inter_op_threads
    )
    try:
        with tempfile.TemporaryDirectory(prefix="kfp-horovod-") as workdir:
            job = Job(config, hvd, tf, log, devices, Path(workdir))
            return _train_in(job, sampling)
    except JobError as exc:
        if rank == 0:
            log.error("training failed: %s", exc)
        return exc.exit_code


@dataclass(frozen=True)
class Job:
    """What every step of this rank's training needs."""

    config: TrainConfig
    hvd: Any
    tf: Any
    log: logging.Logger
    devices: Devices
    workdir: Path

    @property
    def rank(self) -> int:
        return int(self.hvd.rank())

    @property
    def size(self) -> int:
        return int(self.hvd.size())

    @property
    def device(self) -> str:
        return self.devices.device

    @property
    def threads(self) -> int:
        return self.devices.threads

    def device_problem(self) -> str | None:
        """Why this rank cannot train on the GPUs the job asked for (`devices.gpu_problem`)."""
        if self.config.gpus_per_worker <= 0:
            return None
        from components.train.cuda import missing_cuda_libraries

        return gpu_problem(
            self.config.gpus_per_worker,
            int(self.hvd.local_size()),
            self.devices.gpus_found,
            list(missing_cuda_libraries()),
        )

    @property
    def gradient_allreduce(self) -> str:
        """How gradients are averaged: ``nccl`` (GPU to GPU) or ``host`` (through host memory)."""
        return "nccl" if self.devices.on_gpu and self.hvd.nccl_built() else "host"

    @property
    def scaled_lr(self) -> float:
        """The learning rate scaled by the world size."""
        return self.config.learning_rate * self.size


@dataclass
class Trainee:
    """The model being trained, its checkpoint, and where a resumed run starts."""

    model: Any
    ckpt: Any
    resume: checkpoints.CheckpointInfo | None

    @property
    def initial_epoch(self) -> int:
        return self.resume.epoch if self.resume else 0


def _train_in(job: Job, sampling: Sampling) -> int:
    """The Horovod checklist: agree on inputs, build or resume, fit, gather and export.

    An elastic job (``min_workers`` > 0) runs the same steps inside Horovod's elastic loop
    (`components.train.elastic`).
    """
    if job.config.elastic:
        from components.train.elastic import train_elastic

        return train_elastic(job, build_or_resume(job), sampling)
    shard = agree_on_inputs(job, sampling)
    log_plan(job, shard)
    trainee = build_or_resume(job)
    plan = plan_epochs(job, shard, sampling, trainee.initial_epoch)
    stats = EpochStats(samples_per_epoch=len(shard.labels))
    final_metrics = dict(trainee.resume.metrics) if trainee.resume else {}
    callbacks = training_callbacks(job, trainee, shard.steps, stats)
    final_metrics = fit_epochs(job, trainee, shard, plan, callbacks) or final_metrics
    ids = plan.first_epoch_ids(shard)
    return gather_and_export(job, trainee, shard, final_metrics, stats, ids)


def agree_on_inputs(job: Job, sampling: Sampling) -> Shard:
    """Check this rank's devices and read its shard; every rank learns whether any rank failed
    before anyone trains."""
    config, rank, size = job.config, job.rank, job.size
    error = job.device_problem()
    shard: Shard | None = None
    if error is None:
        try:
            shard = sampling.load(config, rank, size)
            if rank == 0 and storage.exists(storage.join(config.model_uri, "saved_model.pb")):
                error = (
                    f"{config.model_uri}: a model is already exported there; refusing to overwrite"
                )
        except (dataset.DataError, ValueError) as exc:
            error = str(exc)
    errors = _agree(error)
    if any(errors):
        if error:
            job.log.error("cannot train: %s", error)
        first = next(e for e in errors if e)
        raise JobError(f"{sum(1 for e in errors if e)} of {size} ranks cannot train: {first}")
    assert shard is not None
    return shard


def log_plan(job: Job, shard: Shard) -> None:
    """Rank 0 says, in plain words, what the job is about to do."""
    config, size = job.config, job.size
    job.log.info(
        "ONE Horovod job: %d workers (%s local per host, formed by the %s controller) train ONE "
        "model together. Each rank reads a disjoint 1/%d of the %d training samples and runs %d "
        "steps per epoch; gradients are averaged every step; rank 0 alone logs, checkpoints and "
        "exports.",
        size, job.hvd.local_size(), controller(job.hvd), size, shard.total, shard.steps,
    )  # fmt: skip
    job.log.info(
        "global batch %d = %d workers x %d; learning rate %g = %g x %d, warmed up over %d "
        "epoch(s); device %s, %d thread(s) per worker",
        config.batch_size_per_worker * size, size, config.batch_size_per_worker,
        job.scaled_lr, config.learning_rate, size, config.warmup_epochs, job.device, job.threads,
    )  # fmt: skip


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
    optimizer = _distributed_optimizer(
        job, keras.optimizers.legacy.Adam(learning_rate=job.scaled_lr)
    )
    model.compile(optimizer=optimizer, loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    if config.jit_compile:
        model.train_step = _xla_train_step(model, tf, keras)
    ckpt = tf.train.Checkpoint(model=model, optimizer=optimizer)
    if resume:
        checkpoints.restore(ckpt, config.checkpoint_uri, resume, job.workdir)
        job.log.info("resuming from checkpoint after epoch %d of %d", resume.epoch, config.epochs)
    return Trainee(model, ckpt, resume)


def _distributed_optimizer(job: Job, optimizer: Any) -> Any:
    """Horovod's DistributedOptimizer around `optimizer`, with the config's levers.

    ``backward_passes_per_step`` k > 1: each rank sums k batches' gradients locally, then one
    allreduce; the update uses their mean (``average_aggregated_gradients``), as one batch k
    times bigger would, and the optimizer steps once per k batches.
    """
    config, hvd = job.config, job.hvd
    return hvd.DistributedOptimizer(
        optimizer,
        compression=getattr(hvd.Compression, config.compression),
        backward_passes_per_step=config.backward_passes_per_step,
        average_aggregated_gradients=config.backward_passes_per_step > 1,
    )


def _xla_train_step(model: Any, tf: Any, keras: Any) -> Callable[[Any], Any]:
    """Keras' train step with the forward and backward pass compiled by XLA, the allreduce not.

    ``model.compile(jit_compile=True)`` would compile the whole step, and Horovod's allreduce
    has no XLA kernel on CPU (HorovodAllreduce: "No registered OpKernel for XLA_CPU_JIT"). So
    XLA compiles the gradients and the DistributedOptimizer reduces and applies them as in its
    own ``minimize`` (compression and backward passes per step included).
    """

    @tf.function(jit_compile=True)
    def forward_backward(x: Any, y: Any, sample_weight: Any) -> tuple[Any, Any]:
        with tf.GradientTape() as tape:
            y_pred = model(x, training=True)
            loss = model.compute_loss(x, y, y_pred, sample_weight)
        return y_pred, tape.gradient(loss, model.trainable_variables)

    def train_step(data: Any) -> Any:
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        y_pred, grads = forward_backward(x, y, sample_weight)
        variables = model.trainable_variables
        reduced = model.optimizer._allreduce(grads, variables)  # what its minimize() does
        model.optimizer.apply_gradients(list(zip(reduced, variables, strict=True)))
        return model.compute_metrics(x, y, y_pred, sample_weight)

    return train_step


def training_callbacks(job: Job, trainee: Trainee, steps: int, stats: EpochStats) -> list[Any]:
    """Horovod's broadcast, metric averaging and warmup; our stats, progress and checkpoints.

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
    callbacks.append(_make_stats_callback(keras, stats))
    if job.rank == 0:
        callbacks.append(_make_progress_callback(keras, job.log, config.epochs, job.size, stats))
        callbacks.append(
            _make_checkpoint_callback(
                keras, trainee.ckpt, config.checkpoint_uri, config.model, job.log
            )
        )
    return callbacks


@dataclass(frozen=True)
class EpochPlan:
    """The batches of the epochs a fit runs, from epoch `start` on (see `epoch_batches`)."""

    start: int
    rows: np.ndarray
    lengths: np.ndarray
    steps: int

    def epoch_ids(self, shard: Shard, epoch: int) -> np.ndarray:
        """The global sample ids this rank serves in `epoch`, batch by batch."""
        first = (epoch - self.start) * self.steps
        rows, lengths = self.rows[first : first + self.steps], self.lengths[first:]
        return shard.start + np.concatenate(
            [row[:n] for row, n in zip(rows, lengths[: len(rows)], strict=True)]
        )

    def first_epoch_ids(self, shard: Shard) -> np.ndarray:
        return self.epoch_ids(shard, self.start)


def plan_epochs(job: Job, shard: Shard, sampling: Sampling, start: int) -> EpochPlan:
    """The batches of the epochs left after `start` (or, if none are, of one epoch: for the
    coverage check)."""
    epochs_left = range(start, job.config.epochs) or range(start, start + 1)
    rows, lengths = sampling.batches(shard, job.config.seed, job.rank, epochs_left)
    return EpochPlan(start, rows, lengths, shard.steps)


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


def gather_and_export(
    job: Job,
    trainee: Trainee,
    shard: Shard,
    final_metrics: dict[str, float],
    stats: EpochStats,
    epoch_ids: np.ndarray,
    extra: dict[str, Any] | None = None,
) -> int:
    """Every rank shares what it did; rank 0 exports the one model and the run summary (with
    `extra`'s keys added)."""
    from horovod.tensorflow import allgather_object

    mine = {
        "rank": job.rank,
        "local_rank": job.hvd.local_rank(),
        "host": socket.gethostname(),
        "device": job.device,
        **gpu_usage(job.tf, job.devices),
        "threads": job.threads,
        "sample_range": [shard.start, shard.stop],
        "samples_per_epoch": int(len(shard.labels)),
        "steps_per_epoch": shard.steps,
        "examples_per_second": stats.examples_per_second(),
        "weights_sha256": weights_fingerprint(trainee.model),
    }
    per_rank = allgather_object(mine)
    all_ids = allgather_object(epoch_ids)
    if job.rank != 0:
        return EXIT_OK
    summary = _summarise(
        job.config, job.size, shard, job.scaled_lr, trainee.initial_epoch, final_metrics,
        per_rank, all_ids,
    )  # fmt: skip
    summary["controller"] = controller(job.hvd)
    summary["gradient_allreduce"] = job.gradient_allreduce
    summary["model_parameters"] = count_parameters(trainee.model)
    summary.update(extra or {})
    summary.update(_export(trainee.model, job.config.model_uri))
    storage.write_text(job.config.summary_uri, json.dumps(summary, indent=2, sort_keys=True))
    for line in coordination_lines(summary):
        job.log.info("%s", line)
    return EXIT_OK


class EpochStats:
    """Per-rank epoch timings; examples/s excludes the first (warm-up) epoch when possible."""

    def __init__(self, samples_per_epoch: int) -> None:
        self.samples_per_epoch = samples_per_epoch
        self.seconds: list[float] = []

    def examples_per_second(self) -> float:
        timed = self.seconds[1:] or self.seconds
        if not timed:
            return 0.0
        return round(self.samples_per_epoch / float(np.median(timed)), 1)


def _make_stats_callback(keras: Any, stats: EpochStats) -> Any:
    class StatsCallback(keras.callbacks.Callback):  # type: ignore[misc, name-defined]
        def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
            self._t0 = time.perf_counter()

        def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
            stats.seconds.append(time.perf_counter() - self._t0)

    return StatsCallback()


def _make_progress_callback(
    keras: Any, log: logging.Logger, epochs: int, size: int, stats: EpochStats
) -> Any:
    class ProgressCallback(keras.callbacks.Callback):  # type: ignore[misc, name-defined]
        def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
            logs = logs or {}
            lr = float(keras.backend.get_value(self.model.optimizer.lr))
            rate = stats.samples_per_epoch / stats.seconds[-1] if stats.seconds else 0.0
            log.info(
                "Epoch %d/%d - loss %.4f - accuracy %.4f (averaged over %d ranks) - lr %.5f - "
                "%.0f examples/s on rank 0",
                epoch + 1,
                epochs,
                logs.get("loss", float("nan")),
                logs.get("accuracy", float("nan")),
                size,
                lr,
                rate,
            )

    return ProgressCallback()


def _make_checkpoint_callback(
    keras: Any, ckpt: Any, checkpoint_uri: str, model: str, log: logging.Logger
) -> Any:
    class CheckpointCallback(keras.callbacks.Callback):  # type: ignore[misc, name-defined]
        def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
            metrics = {k: float(v) for k, v in (logs or {}).items() if k != "lr"}
            checkpoints.save(ckpt, checkpoint_uri, epoch + 1, metrics, model)
            log.info("checkpoint after epoch %d written to %s", epoch + 1, checkpoint_uri)

    return CheckpointCallback()


def _summarise(
    config: TrainConfig,
    size: int,
    shard: Shard,
    scaled_lr: float,
    initial_epoch: int,
    final_metrics: dict[str, float],
    per_rank: list[dict[str, Any]],
    all_ids: list[np.ndarray],
) -> dict[str, Any]:
    fingerprints = {r["weights_sha256"] for r in per_rank}
    return {
        "kind": SUMMARY_KIND,
        "world_size": size,
        "expected_workers": config.world_size,
        "hosts": sorted({r["host"] for r in per_rank}),
        "epochs": config.epochs,
        "resumed_from_epoch": initial_epoch,
        "batch_size_per_worker": config.batch_size_per_worker,
        "global_batch_size": config.batch_size_per_worker * size,
        "base_learning_rate": config.learning_rate,
        "learning_rate": scaled_lr,
        "warmup_epochs": config.warmup_epochs,
        "model": config.model,
        "augment": config.augment,
        "dataset": {
            "uri": config.data,
            "manifest_sha256": shard.manifest_sha256,
            "train_samples": shard.total,
        },
        "per_rank": sorted(per_rank, key=lambda r: r["rank"]),
        "coverage": {"samples": shard.total, **coverage(all_ids, shard.total)},
        "weights_identical_across_ranks": len(fingerprints) == 1,
        "final_metrics": final_metrics,
        "checkpoint_uri": config.checkpoint_uri,
        "models_exported": 1,
        "exported_by_rank": 0,
        "levers": {
            "compression": config.compression,
            "backward_passes_per_step": config.backward_passes_per_step,
            "jit_compile": config.jit_compile,
            "inter_op_threads": config.inter_op_threads,
        },
    }


def coverage(all_ids: list[np.ndarray], total: int) -> dict[str, Any]:
    """Whether the ranks' ids of one epoch (one array per rank) cover 0..total-1 exactly once."""
    ids = np.concatenate(all_ids)
    return {
        "seen_per_epoch": int(len(ids)),
        "disjoint": bool(len(np.unique(ids)) == len(ids)),
        "covers_all": bool(np.array_equal(np.sort(ids), np.arange(total))),
    }


def _export(model: Any, model_uri: str) -> dict[str, Any]:
    """Rank 0 writes the one SavedModel (no optimizer: it loads without Horovod)."""
    with tempfile.TemporaryDirectory(prefix="export-") as tmp:
        local = Path(tmp) / "model"
        model.save(str(local), include_optimizer=False, save_format="tf")
        pb_sha256 = dataset.sha256_bytes((local / "saved_model.pb").read_bytes())
        storage.upload_dir(local, model_uri, last="saved_model.pb")
    return {"model_uri": model_uri, "saved_model_sha256": pb_sha256}


def coordination_lines(summary: dict[str, Any]) -> list[str]:
    """The plain-words answer to 'one model or N?', for the log."""
    size = summary["world_size"]
    lines = [
        f"{size} workers formed ONE job ({summary['controller']} controller) and trained ONE "
        f"model (weights identical on all ranks: {summary['weights_identical_across_ranks']}); "
        f"gradient allreduce {summary['gradient_allreduce']}.",
        f"model {summary['model']} ({summary['model_parameters']:,} parameters), augmentation "
        f"{'on' if summary['augment'] else 'off'}",
    ]
    for r in summary["per_rank"]:
        lo, hi = r["sample_range"]
        lines.append(
            f"  rank {r['rank']} on {r['host']} ({device_text(r)}, {r['threads']} threads): "
            f"samples [{lo}, {hi}) = {r['samples_per_epoch']} per epoch, "
            f"{r['steps_per_epoch']} steps per epoch, {r['examples_per_second']} examples/s"
        )
    cov = summary["coverage"]
    lines.append(
        f"every epoch saw {cov['seen_per_epoch']} of {cov['samples']} samples "
        f"(disjoint: {cov['disjoint']}, all covered: {cov['covers_all']})"
    )
    history = world_history(summary)
    if history:
        lines.append(history)
    lines.append(f"1 model, exported by rank 0, at {summary['model_uri']}")
    return lines
