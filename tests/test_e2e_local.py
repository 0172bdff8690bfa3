"""The embedded default end to end: ``python -m pipeline run-local`` (what ``make run`` runs),
on a tiny configuration: kfp.local, a real 2-rank horovodrun, local disk for GCS, and the
``small`` model (the default, mnist_advanced, is 17x the compute per example). The first run
is the session's `local_pipeline_run` (tests/conftest.py), which the benchmark smoke test
also times."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from components.train.summary import parse
from tests.conftest import LocalRun, run_local_pipeline

pytestmark = pytest.mark.e2e


def read_scalars(log_dir: Path) -> dict[str, dict[str, list[tuple[int, float]]]]:
    """Every scalar of the event files under `log_dir`, read with TensorBoard's own reader:
    run -> tag -> [(step, value)], as TensorBoard shows them."""
    from tensorboard.backend.event_processing.event_accumulator import TENSORS, EventAccumulator
    from tensorboard.util.tensor_util import make_ndarray

    runs: dict[str, dict[str, list[tuple[int, float]]]] = {}
    for run_dir in sorted(p for p in log_dir.iterdir() if p.is_dir()):
        events = EventAccumulator(str(run_dir), size_guidance={TENSORS: 0})
        events.Reload()
        runs[run_dir.name] = {
            tag: [(e.step, float(make_ndarray(e.tensor_proto))) for e in events.Tensors(tag)]
            for tag in events.Tags()["tensors"]
        }
    return runs


def test_make_run_equivalent_end_to_end(local_pipeline_run: LocalRun) -> None:
    root, first = local_pipeline_run.root, local_pipeline_run.outputs()

    summary_path = Path(first["run_summary"])
    # the train step's run_summary artifact, beside its model artifact
    assert summary_path == Path(first["model"]).parent / "run_summary"
    summary = parse(summary_path.read_text())
    assert summary.world_size == 2 and summary.weights_identical_across_ranks is True
    assert (summary.config.model, summary.config.augment) == ("small", False)
    assert summary.training_backend == "local"  # make run trains here, as run-local's default
    model = Path(first["model"])
    assert (model / "saved_model.pb").exists()
    assert len(list(root.rglob("pipeline-root/**/saved_model.pb"))) == 1  # ONE model
    assert "2 workers formed ONE Horovod job" in Path(first["coordination_report"]).read_text()
    # ... and says whether the workers paid, from the ranks' own timings.
    assert summary.resource_use is not None
    efficiency = summary.resource_use["estimated_efficiency"]
    assert first["paid"].startswith(f"estimated scaling efficiency {efficiency:.2f} (a step: ")
    assert "| 9 |" in Path(first["evaluation_report"]).read_text()  # per-class table
    accuracy = float(first["metrics"].split()[1].rstrip(","))
    assert accuracy > 0.3
    # TensorBoard: rank 0's scalars for each epoch, the test metrics at the last one
    board = Path(summary.config.tensorboard_uri)
    assert board == summary_path.parent / "train-work" / "tensorboard"
    assert f"tensorboard --logdir {board}" in Path(first["coordination_report"]).read_text()
    assert f"tensorboard --logdir {board}" in Path(first["evaluation_report"]).read_text()
    scalars = read_scalars(board)
    epochs = summary.config.epochs
    shares = {"compute_share", "communication_share", "waiting_share", "input_share"}
    metrics = {"loss", "accuracy", "learning_rate", "examples_per_second"}
    assert set(scalars["train"]) == metrics | shares
    assert [step for step, _ in scalars["train"]["loss"]] == list(range(1, epochs + 1))
    final_loss = scalars["train"]["loss"][-1][1]
    assert final_loss == pytest.approx(summary.final_metrics["loss"], rel=1e-5)
    assert scalars["evaluation"]["test_accuracy"] == [(epochs, pytest.approx(accuracy, abs=1e-4))]

    version = Path(first["registry_entry"])
    assert version == root / "registry" / "mnist-cnn" / "1"
    assert (version / "saved_model.pb").read_bytes() == (model / "saved_model.pb").read_bytes()
    assert first["decision"].startswith("registered as version 1; promoted")

    # A second run with a bar it cannot reach: recorded as a decision, nothing registered.
    second = run_local_pipeline(root, "--min-accuracy", "0.999").outputs()
    assert second["decision"].startswith("not registered:"), second["decision"]
    assert "< minimum 0.9990" in second["decision"]
    assert second["registry_entry"] == "(none)"
    versions = sorted(p.name for p in (root / "registry" / "mnist-cnn").iterdir())
    assert [v for v in versions if v.isdigit()] == ["1"]


def test_a_keras_3_users_model_trains_registers_and_serves(tmp_path: Path) -> None:
    """A model written for today's Keras (``keras.ops``, a custom layer, the functional API)
    goes through ``run-local`` across 2 ranks, is registered, and `make serve`'s server answers
    with what the evaluate step computed from the same SavedModel."""
    from components.common.tests.datasets import read_arrays
    from components.serve.tests.test_serve import evaluate_step_predictions, running, served

    user = "components.train.tests.user_model:build"
    run = run_local_pipeline(tmp_path, "--model", user, "--min-accuracy", "0").outputs()
    summary = parse(Path(run["run_summary"]).read_text())
    assert (summary.config.model, summary.world_size) == (user, 2)
    assert summary.weights_identical_across_ranks and summary.metrics_averaged_across_ranks
    assert run["decision"].startswith("registered as version 1; promoted")
    dataset = Path(run["dataset"])
    images = read_arrays(str(dataset), "test")[0][:50]
    with running(str(tmp_path / "registry")) as (banner, url):
        answered = served(url, images)
    assert banner.startswith("serving ") and answered.shape == (50, 10)
    expected = evaluate_step_predictions(run["model"], images)
    np.testing.assert_allclose(answered, expected, atol=1e-5)
