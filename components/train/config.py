"""The trainer's settings, checked before any work starts."""

from __future__ import annotations

from dataclasses import dataclass

from components.common import storage
from components.common.defaults import (
    BASE_LEARNING_RATE,
    BATCH_SIZE_PER_WORKER,
    EPOCHS,
    SHUFFLE_SEED,
    WARMUP_EPOCHS,
)


@dataclass(frozen=True)
class TrainConfig:
    """What one Horovod job trains, from where, to where.

    `output` receives ``run_summary.json`` and, unless overridden, ``checkpoints/`` and the
    exported SavedModel in ``model/``.
    """

    data: str
    output: str
    expected_workers: int
    model_dir: str | None = None
    checkpoint_dir: str | None = None
    epochs: int = EPOCHS
    batch_size_per_worker: int = BATCH_SIZE_PER_WORKER
    base_learning_rate: float = BASE_LEARNING_RATE
    warmup_epochs: int = WARMUP_EPOCHS
    seed: int = SHUFFLE_SEED
    threads_per_worker: int | None = None
    fail_after_epoch: int | None = None  # fault injection for resume tests and drills

    def __post_init__(self) -> None:
        problems = []
        if not self.data:
            problems.append("--data is empty")
        if not self.output:
            problems.append("--output is empty")
        if self.expected_workers < 1:
            problems.append(f"--expected-workers must be >= 1, got {self.expected_workers}")
        if self.epochs < 1:
            problems.append(f"--epochs must be >= 1, got {self.epochs}")
        if self.batch_size_per_worker < 1:
            problems.append(f"--batch-size must be >= 1, got {self.batch_size_per_worker}")
        if not self.base_learning_rate > 0:
            problems.append(f"--learning-rate must be > 0, got {self.base_learning_rate}")
        if self.warmup_epochs < 0:
            problems.append(f"--warmup-epochs must be >= 0, got {self.warmup_epochs}")
        if self.threads_per_worker is not None and self.threads_per_worker < 1:
            problems.append(f"--threads-per-worker must be >= 1, got {self.threads_per_worker}")
        if problems:
            raise ValueError("; ".join(problems))

    @property
    def model_uri(self) -> str:
        """Where the single SavedModel is exported."""
        return self.model_dir or storage.join(self.output, "model")

    @property
    def checkpoint_uri(self) -> str:
        """Where rank 0 writes one checkpoint per epoch."""
        return self.checkpoint_dir or storage.join(self.output, "checkpoints")

    @property
    def summary_uri(self) -> str:
        """Where rank 0 writes ``run_summary.json``."""
        return storage.join(self.output, "run_summary.json")
