"""The programs' gs:// paths, with the real google-cloud-storage client against
fake-gcs-server: prep writes to gs://, a real 2-rank Horovod job reads the dataset from
it and writes its checkpoints, summary and model there, the evaluator reads the model from
it, and registration publishes to it. (The emulator is the only stand-in: it is GCS's JSON
API on localhost, preconditions included; the races themselves are in the registry tests.)"""

from __future__ import annotations

import pytest

from components.common import storage
from components.data_prep.prep import prepare
from components.evaluate.evaluate import evaluate
from components.register.register import register
from components.train.config import TrainConfig
from components.train.launcher.launch import run_local
from components.train.summary import read

pytestmark = pytest.mark.horovod


def test_prep_train_evaluate_register_through_gcs(gcs_uri: str) -> None:
    data = f"{gcs_uri}/datasets/mnist"
    prepare("bundled", data, shard_size=250, data_limit=600)
    assert storage.exists(f"{data}/manifest.json")

    lines: list[str] = []
    config = TrainConfig(
        data=data, output=f"{gcs_uri}/runs/r1", workers=2, epochs=2,
        batch_size_per_worker=32, threads_per_worker=1, model="small",
    )  # fmt: skip
    code = run_local(config, timeout_s=400, log=lines.append)
    assert code == 0, "\n".join(lines)
    summary = read(config.summary_uri)
    assert summary.model_uri == f"{gcs_uri}/runs/r1/model"
    assert summary.dataset["uri"] == data and summary.world_size == 2
    files = storage.list_files(f"{gcs_uri}/runs/r1")
    assert f"{gcs_uri}/runs/r1/model/saved_model.pb" in files
    assert f"{gcs_uri}/runs/r1/checkpoints/checkpoint" in files
    assert sum(f.endswith("saved_model.pb") for f in files) == 1

    result = evaluate(summary.model_uri, data)
    assert result.samples == 600 and 0.0 <= result.accuracy <= 1.0

    decision = register(
        summary.model_uri, config.summary_uri, data, result.accuracy, result.loss,
        registry_root=f"{gcs_uri}/models", pipeline_run_id="run-gcs-1", min_accuracy=0.0,
    )  # fmt: skip
    assert decision.registered and decision.version == 1
    assert decision.version_uri == f"{gcs_uri}/models/mnist-cnn/1"
    assert storage.exists(f"{gcs_uri}/models/mnist-cnn/1/saved_model.pb")
