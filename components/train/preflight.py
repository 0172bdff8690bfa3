"""Preflight: what must hold before any rank trains.

- `world_size_problem` (every rank, first thing): are we one Horovod job of the expected size,
  or N unrelated copies? The original report: an MPIJob whose N processes each ran the script
  on its own, each in a world of 1, training its own model and printing its own log lines.
- `check_job_before_launch` (the launcher, once, before any rank starts): a dataset with too
  few training samples for the job's ranks, or a model that does not take its images (a typo
  in a user's entry point included), is one clear message instead of one traceback per rank.
"""

from __future__ import annotations

import os
from typing import Any

from components.common import dataset
from components.common.dataset import ImageSpec
from components.common.defaults import MODELS
from components.common.failure import ExitCode, InputError


class PreflightError(InputError):
    """A launcher's preflight failed; nothing was started."""

    exit_code = ExitCode.PREFLIGHT


def world_size_problem(
    world_size: int, expected_workers: int, rank: int, fewest: int = 0
) -> str | None:
    """Why this job is not of the expected size, or None. An elastic job (`fewest` > 0) may
    have any size from `fewest` to `expected_workers`."""
    if world_size == expected_workers or fewest <= world_size <= expected_workers and fewest:
        return None
    failed = f"kfp-horovod preflight failed [rank {rank}/{world_size}]:"
    if fewest and world_size < fewest:
        return (
            f"{failed} this elastic Horovod job has {world_size} worker(s), fewer than its "
            f"minimum of {fewest} (--min-workers x --slots-per-worker); elastic horovodrun must "
            f"start it with --min-np {fewest}. Nothing was trained or written."
        )
    planned = f"{expected_workers} (--workers x --slots-per-worker)"
    if world_size < expected_workers:
        what = (
            f"This process is in a Horovod job of {world_size} worker(s), but the job was "
            f"started for {planned}. The processes that were started are independent copies, "
            "not one job: each would train its own model on all the data and print its own copy "
            "of every log line (the 'every line N times' symptom)."
        )
    else:
        what = (
            f"This Horovod job has {world_size} workers, but it was started for {planned}: more "
            "processes joined than were planned (check -np, the MPIJob's replicas and "
            "slotsPerWorker)."
        )
    n = expected_workers
    return (
        f"{failed} {what} Start exactly {n} processes as ONE job: locally `horovodrun -np {n} "
        f"-H localhost:{n} python -m components.train ...`; on Kubernetes an MPIJob whose "
        f"launcher runs `horovodrun` or `mpirun -np {n}` across workers x slotsPerWorker (see "
        "`python -m pipeline render-mpijob`). Nothing was trained or written."
    )


def check_model_before_launch(
    model: str, image: ImageSpec | None = None, num_classes: int = 0
) -> None:
    """Raise PreflightError if the trainer cannot train `model` on the dataset's images
    (`image`) and `num_classes` classes. A built-in is checked against the smallest image it
    takes, without TensorFlow. A user's model is imported; with `image` (the dataset is known)
    it is built once, here, as every rank would build it, and run on a black and a white image,
    whose rows must be probabilities. Before data prep (no `image`) its import alone is
    checked."""
    from components.train.model import (
        ModelChoiceError,
        build_model,
        built_in_problem,
        import_model_function,
    )

    try:
        if model in MODELS:
            problem = built_in_problem(model, image.shape) if image else None
            if problem:
                raise ModelChoiceError(problem)
            return
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # TF's notes, as the ranks have
        if image is None:
            import_model_function(model)
            return
        import numpy as np

        images = np.stack([np.zeros(image.shape), np.full(image.shape, 255)]).astype(np.uint8)
        built = build_model(0, model, shape=image.shape, num_classes=num_classes)
        rows = np.asarray(built(images, training=False))
        sums_to_1 = np.allclose(rows.sum(1), 1, 1e-3)
        if not (np.isfinite(rows).all() and (rows >= 0).all() and sums_to_1):
            raise ModelChoiceError(
                f"model {model!r} returns outputs that are not class probabilities (rows of "
                f"non-negative numbers summing to 1, e.g. {np.round(rows[0], 3).tolist()}): end "
                "it with a softmax; the trainer's loss is sparse_categorical_crossentropy on "
                "probabilities"
            )
    except ModelChoiceError as exc:
        raise PreflightError(f"kfp-horovod preflight failed: {exc}. No rank was started.") from exc


def check_job_before_launch(config: Any) -> None:
    """Raise PreflightError (or the dataset's DataError), starting nothing, if the job of
    `config` (a TrainConfig) cannot train: its dataset's manifest is unreadable, its training
    split is too small for its ranks (`data.ranks_problem`), or its model does not take the
    dataset's images and classes (`check_model_before_launch`)."""
    from components.train.data import ranks_problem

    manifest = dataset.read_manifest(config.data)
    train = manifest.count("train")
    problem = ranks_problem(train, config.world_size, config.batch_size_per_worker)
    if problem:
        raise PreflightError(
            f"kfp-horovod preflight failed: {config.data}: {problem}. No rank was started."
        )
    check_model_before_launch(config.model, manifest.image, manifest.num_classes)
