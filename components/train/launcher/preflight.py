"""The launcher's preflight, once, before any rank starts: a dataset with too few training samples
for the job's ranks, or a model that does not take its images, is one clear message instead of
one traceback per rank. Runs in the launcher (a local launch) and in the train step's pod before
it creates a cluster job; each rank's own size check is `components.train.rank.world_size`.
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


def check_model_before_launch(
    model: str, image: ImageSpec | None = None, num_classes: int = 0
) -> None:
    """Raise PreflightError if the trainer cannot train `model` on the dataset's images
    (`image`) and `num_classes` classes. A built-in is checked against the smallest image it
    takes, without TensorFlow. A user's model is imported; with `image` (the dataset is known)
    it is built once, here, as every rank would build it, and run on a black and a white image,
    whose rows must be probabilities. Before data prep (no `image`) its import alone is
    checked."""
    from components.train.rank.model import (
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
    from components.train.rank.data import ranks_problem

    manifest = dataset.read_manifest(config.data)
    train = manifest.count("train")
    problem = ranks_problem(train, config.world_size, config.batch_size_per_worker)
    if problem:
        raise PreflightError(
            f"kfp-horovod preflight failed: {config.data}: {problem}. No rank was started."
        )
    check_model_before_launch(config.model, manifest.image, manifest.num_classes)
