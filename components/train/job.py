"""One rank's part of the job: what every step of its training needs (`Job`), the error the
ranks agree on (`JobError`), and the rank-tagged log.
"""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from components.common import dataset, storage
from components.train import checkpoints
from components.train.config import TrainConfig
from components.train.data import Shard, load_shard
from components.train.devices import Devices, gpu_problem
from components.train.optimizer import AdamSettings, adam_settings, lr_formula

EXIT_OK = 0
EXIT_BAD_INPUT = 2


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


def controller(hvd: Any) -> str:
    """Which Horovod controller formed the job: ``mpi`` (mpirun) or ``gloo`` (horovodrun)."""
    return "mpi" if hvd.mpi_enabled() else "gloo"


def agree(error: str | None) -> list[str | None]:
    """Every rank learns every rank's error (or None): nobody waits for a rank that gave up."""
    from horovod.tensorflow import allgather_object

    return list(allgather_object(error))


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
    def adam(self) -> AdamSettings:
        """Adam's settings for this world size under the job's ``lr_scaling`` rule."""
        return adam_settings(self.config.lr_scaling, self.config.learning_rate, self.size)

    @property
    def scaled_lr(self) -> float:
        """The learning rate the rule gives this world size."""
        return self.adam.learning_rate


@dataclass
class Trainee:
    """The model being trained, its checkpoint, where a resumed run starts, and the clock of
    its gradient allreduce (`resources.AllreduceClock`)."""

    model: Any
    ckpt: Any
    resume: checkpoints.CheckpointInfo | None
    clock: Any

    @property
    def initial_epoch(self) -> int:
        return self.resume.epoch if self.resume else 0


def agree_on_inputs(job: Job) -> Shard:
    """Check this rank's devices and read its shard; every rank learns whether any rank failed
    before anyone trains."""
    config, rank, size = job.config, job.rank, job.size
    error = job.device_problem()
    shard: Shard | None = None
    if error is None:
        try:
            shard = load_shard(config, rank, size)
            if rank == 0 and storage.exists(storage.join(config.model_uri, "saved_model.pb")):
                error = (
                    f"{config.model_uri}: a model is already exported there; refusing to overwrite"
                )
        except (dataset.DataError, ValueError) as exc:
            error = str(exc)
    errors = agree(error)
    if any(errors):
        first = next(e for e in errors if e)
        if error and error != first:  # rank 0 reports `first` once, for every rank that shares it
            job.log.error("cannot train: %s", error)
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
        "global batch %d = %d workers x %d; learning rate %s, warmed up over %d epoch(s); "
        "device %s, %d thread(s) per worker",
        config.batch_size_per_worker * size, size, config.batch_size_per_worker,
        lr_formula(config.lr_scaling, config.learning_rate, size), config.warmup_epochs,
        job.device, job.threads,
    )  # fmt: skip
