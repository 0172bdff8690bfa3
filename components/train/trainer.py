"""The Horovod training program: every rank of the job runs :func:`run`.

What each rank does, in order:

1. ``hvd.init()`` and the preflight: the world size must be ``--workers`` x ``--slots-per-worker``.
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

import logging
import os
import sys
import tempfile
import warnings
from pathlib import Path
from typing import Any

from components.common import keras_env
from components.train.config import TrainConfig
from components.train.data import plan_epochs
from components.train.devices import configure_devices
from components.train.elastic import train_elastic
from components.train.export import gather_and_export
from components.train.fit import EpochStats, build_or_resume, fit_epochs, training_callbacks
from components.train.job import Job, JobError, agree_on_inputs, log_plan, rank_logger
from components.train.preflight import EXIT_PREFLIGHT, world_size_problem


def _quiet_tensorflow(tf: Any, rank: int) -> None:
    """TF's and Python's warnings only from rank 0 (one copy, not one per rank), without the
    first-step callback-timing note."""
    if rank != 0:
        warnings.simplefilter("ignore")
    tf_logger = tf.get_logger()
    tf_logger.setLevel(logging.WARNING if rank == 0 else logging.ERROR)
    tf_logger.addFilter(lambda record: "compared to the batch time" not in record.getMessage())


def run(config: TrainConfig) -> int:
    """Run this rank's part of the job. Returns the process exit code."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    keras_env.keras()  # first: Keras 2 and the `keras` alias, before Horovod loads (keras_env)
    import horovod.tensorflow.keras as hvd
    import tensorflow as tf

    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    log = rank_logger(rank, size)
    _quiet_tensorflow(tf, rank)

    fewest = config.min_world_size if config.elastic else 0
    problem = world_size_problem(size, config.world_size, rank, fewest)
    if problem:
        sys.stderr.write(problem + "\n")  # one write: mpirun tags each chunk a rank writes
        sys.stderr.flush()
        return EXIT_PREFLIGHT

    devices = configure_devices(
        tf, hvd.local_rank(), hvd.local_size(), config.threads_per_worker, quiet=rank != 0
    )
    try:
        with tempfile.TemporaryDirectory(prefix="kfp-horovod-") as workdir:
            job = Job(config, hvd, tf, log, devices, Path(workdir))
            return _train_in(job)
    except JobError as exc:
        if rank == 0:
            log.error("training failed: %s", exc)
        return exc.exit_code


def _train_in(job: Job) -> int:
    """The Horovod checklist: agree on inputs, build or resume, fit, gather and export.

    An elastic job (``min_workers`` > 0) runs the same steps inside Horovod's elastic loop
    (`components.train.elastic`).
    """
    if job.config.elastic:
        return train_elastic(job, build_or_resume(job))
    shard = agree_on_inputs(job)
    log_plan(job, shard)
    trainee = build_or_resume(job)
    plan = plan_epochs(shard, job.config, job.rank, trainee.initial_epoch)
    stats = EpochStats(samples_per_epoch=len(shard.labels))
    final_metrics = dict(trainee.resume.metrics) if trainee.resume else {}
    callbacks = training_callbacks(job, trainee, shard.steps, stats)
    final_metrics = fit_epochs(job, trainee, shard, plan, callbacks) or final_metrics
    ids = plan.first_epoch_ids(shard)
    return gather_and_export(job, trainee, shard, final_metrics, stats, ids)
