"""Fixtures shared by the register tests."""

from __future__ import annotations

import json
from pathlib import Path

import pytest


@pytest.fixture
def summary(trained_model, tmp_path: Path) -> str:
    """A run summary as the trainer writes it, recording the model's saved_model.pb digest."""
    path = tmp_path / "run_summary.json"
    record = {
        "world_size": 2, "workers": 2, "epochs": 1, "final_loss": 0.5, "model": "small",
        "augment": False,
    }  # fmt: skip
    path.write_text(json.dumps({**record, "saved_model_sha256": trained_model.saved_model_sha256}))
    return str(path)


@pytest.fixture(params=["local", "gcs"])
def root(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A registry root, once on local disk and once on fake-gcs-server."""
    if request.param == "local":
        return str(tmp_path / "registry")
    return f"gs://{request.getfixturevalue('gcs_bucket')}/registry"
