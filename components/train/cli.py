"""Thin CLI of the trainer.

``horovodrun -np N python -m components.train --data ... --expected-workers N``
"""

from __future__ import annotations

import argparse
import sys

from components.common.defaults import (
    BASE_LEARNING_RATE,
    BATCH_SIZE_PER_WORKER,
    EPOCHS,
    SHUFFLE_SEED,
    WARMUP_EPOCHS,
)
from components.train.config import TrainConfig


def parse_args(argv: list[str] | None = None) -> TrainConfig:
    """Parse the command line into a checked TrainConfig (exits 2 with a message if bad)."""
    p = argparse.ArgumentParser(
        prog="python -m components.train",
        description="Train the MNIST CNN as one Horovod job (every rank gets the same arguments).",
    )
    p.add_argument(
        "--data", required=True, help="dataset directory written by data prep (path or gs://)"
    )
    p.add_argument(
        "--output", required=True, help="directory for run_summary.json (and checkpoints/, model/)"
    )
    p.add_argument(
        "--model-dir", default=None, help="where to export the SavedModel (default OUTPUT/model)"
    )
    p.add_argument(
        "--checkpoint-dir", default=None, help="per-epoch checkpoints (default OUTPUT/checkpoints)"
    )
    p.add_argument(
        "--expected-workers",
        type=int,
        required=True,
        help="the world size this job must have; a mismatch stops every process at once",
    )
    p.add_argument("--epochs", type=int, default=EPOCHS)
    p.add_argument("--batch-size", type=int, default=BATCH_SIZE_PER_WORKER, help="per worker")
    p.add_argument(
        "--learning-rate", type=float, default=BASE_LEARNING_RATE, help="before scaling by workers"
    )
    p.add_argument("--warmup-epochs", type=int, default=WARMUP_EPOCHS)
    p.add_argument(
        "--threads-per-worker", type=int, default=None, help="default: cores / local workers"
    )
    p.add_argument("--seed", type=int, default=SHUFFLE_SEED)
    a = p.parse_args(argv)
    try:
        return TrainConfig(
            data=a.data,
            output=a.output,
            model_dir=a.model_dir,
            checkpoint_dir=a.checkpoint_dir,
            expected_workers=a.expected_workers,
            epochs=a.epochs,
            batch_size_per_worker=a.batch_size,
            base_learning_rate=a.learning_rate,
            warmup_epochs=a.warmup_epochs,
            threads_per_worker=a.threads_per_worker,
            seed=a.seed,
        )
    except ValueError as exc:
        p.error(str(exc))
        raise  # unreachable: p.error exits


def main(argv: list[str] | None = None) -> int:
    """Parse arguments and run this rank."""
    from components.train.trainer import run

    return run(parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
