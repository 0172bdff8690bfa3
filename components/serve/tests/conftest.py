"""Fixtures of the serve tests: a second real model (other weights than `trained_model`)."""

from __future__ import annotations

from typing import Any

import pytest


@pytest.fixture(scope="session")
def challenger_model(tiny_dataset: str, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """`build_model` (``small``, another seed) trained 1 epoch on `tiny_dataset` and exported
    as the trainer does: a real SavedModel whose predictions differ from `trained_model`'s."""
    from components.common import keras_env
    from components.common.dataset import load_split
    from components.train.model import build_model
    from tests.conftest import TrainedModel

    x, y = load_split(tiny_dataset, "train")
    model = build_model(seed=3, model="small")
    model.compile(
        optimizer=keras_env.keras().optimizers.Adam(0.003),
        loss="sparse_categorical_crossentropy",
        metrics=["accuracy"],
    )
    model.fit(x, y, epochs=1, batch_size=32, verbose=0)
    path = tmp_path_factory.mktemp("challenger-model") / "model"
    model.save(str(path), include_optimizer=False)
    return TrainedModel(str(path), tiny_dataset, 0.0, 0.0)
