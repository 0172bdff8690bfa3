"""Fixtures shared by the register tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from components.train.config import TrainConfig
from components.train.summary import RunSummary, to_json


@pytest.fixture
def summary(trained_model, tmp_path: Path) -> str:
    """A run summary as the trainer writes it, recording the model's saved_model.pb digest."""
    path = tmp_path / "run_summary.json"
    config = TrainConfig(data="/d", output="/o", workers=2, epochs=1, model="small")
    record = RunSummary(
        config=config, world_size=2, hosts=["h"], controller="mpi", gradient_allreduce="host",
        resumed_from_epoch=0, adam={}, model_parameters=0, dataset={}, per_rank=[], coverage={},
        weights_identical_across_ranks=True, final_metrics={"loss": 0.5},
        saved_model_sha256=trained_model.saved_model_sha256,
    )  # fmt: skip
    path.write_text(to_json(record))
    return str(path)


@pytest.fixture(params=["local", "gcs"])
def root(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A registry root, once on local disk and once on fake-gcs-server."""
    if request.param == "local":
        return str(tmp_path / "registry")
    return f"gs://{request.getfixturevalue('gcs_bucket')}/registry"
