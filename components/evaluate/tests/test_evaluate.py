"""Evaluate: real SavedModels, a fresh-process CLI, gs:// inputs, bad models, the KFP wrapper."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from components.common import dataset, storage
from components.common.failure import ExitCode
from components.common.model_files import ModelError
from components.common.tests.datasets import image_folder, read_arrays
from components.evaluate import evaluate as ev


def test_score_by_hand() -> None:
    p = np.full((4, 10), 0.01)
    for row, cls in enumerate([0, 1, 1, 3]):  # predictions
        p[row, cls] = 0.91
    labels = np.array([0, 1, 2, 3])
    scores = ev.Scores(10)
    scores.add(p[:1], labels[:1])  # batch by batch, as the test split streams
    scores.add(p[1:], labels[1:])
    out = scores.result()
    assert out["accuracy"] == 0.75
    assert out["samples"] == 4
    expected = [[0] * 10 for _ in range(10)]  # rows: true class, columns: predicted class
    for true, predicted in [(0, 0), (1, 1), (2, 1), (3, 3)]:
        expected[true][predicted] = 1
    assert out["confusion_matrix"] == expected
    assert all(type(n) is int for row in out["confusion_matrix"] for n in row)  # JSON-ready
    assert out["precision"][1] == 0.5 and out["recall"][1] == 1.0
    assert out["precision"][2] == 0.0 and out["recall"][2] == 0.0  # never predicted / missed
    assert out["recall"][5] == 0.0  # class absent: reported as 0, not NaN
    expected_loss = -(3 * np.log(0.91) + np.log(0.01)) / 4
    assert out["loss"] == pytest.approx(expected_loss, rel=1e-9)


@pytest.mark.parametrize(
    ("probabilities", "message"),
    [
        (np.full((3, 5), 0.2), r"shape \(3, 5\), expected \(3, 10\)"),
        (np.full((3, 10), np.nan), "NaN"),
        (np.full((3, 10), 1.0), "not probabilities"),
    ],
)
def test_score_rejects_non_probability_outputs(probabilities: np.ndarray, message: str) -> None:
    with pytest.raises(ModelError, match=message):
        ev.Scores(10).add(probabilities, np.array([0, 1, 2]))


def test_evaluate_matches_keras(trained_model, storage_root: str) -> None:
    """The exported model, local or on gs://, scores what Keras said of the in-memory model."""
    model_uri, data_uri = trained_model.path, trained_model.dataset
    if storage.is_gcs(storage_root):
        model_uri, data_uri = f"{storage_root}/models/m1", f"{storage_root}/datasets/d1"
        storage.upload_dir(trained_model.path, model_uri, last="saved_model.pb")
        storage.upload_dir(trained_model.dataset, data_uri, last="manifest.json")
        with pytest.raises(ModelError, match=f"{storage_root}/m2: model directory is missing"):
            ev.evaluate(f"{storage_root}/m2", data_uri)
    result = ev.evaluate(model_uri, data_uri)
    # Keras' own numbers for the in-memory model before export: the export loses nothing.
    assert result.accuracy == pytest.approx(trained_model.accuracy, abs=1e-6)
    assert result.loss == pytest.approx(trained_model.loss, rel=1e-4)
    assert result.accuracy > 0.3  # trained well above chance (0.1)
    _, labels = read_arrays(trained_model.dataset, "test")
    cm = np.array(result.confusion_matrix)
    assert cm.shape == (10, 10) and cm.sum() == result.samples == 400
    assert np.trace(cm) / cm.sum() == pytest.approx(result.accuracy)
    np.testing.assert_array_equal(cm.sum(axis=1), np.bincount(labels, minlength=10))
    for c in range(10):
        assert result.recall[c] == pytest.approx(cm[c, c] / cm[c].sum())
        if cm[:, c].sum():
            assert result.precision[c] == pytest.approx(cm[c, c] / cm[:, c].sum())
    assert result.dataset_manifest_sha256 == dataset.read_manifest(trained_model.dataset).sha256
    assert result.saved_model_sha256 == trained_model.saved_model_sha256
    report = result.to_markdown("m", "d")
    assert f"saved_model.pb sha256: `{trained_model.saved_model_sha256}`" in report
    assert f"accuracy: {result.accuracy:.4f}" in report and report.count("\n| ") == 11


def test_cli_in_a_fresh_process(trained_model, tmp_path: Path) -> None:
    """``python -m components.evaluate.evaluate`` scores the model, and its process loads
    neither Horovod nor the trainer: the SavedModel is all it needs."""
    out = tmp_path / "eval.json"
    argv = ["--model", trained_model.path, "--dataset", trained_model.dataset]
    probe = (
        "import runpy, sys\n"
        f"sys.argv = ['evaluate', *{[*argv, '--output-json', str(out)]!r}]\n"
        "try:\n"
        "    runpy.run_module('components.evaluate.evaluate', run_name='__main__')\n"
        "except SystemExit as exc:\n"
        "    assert not exc.code, exc.code\n"
        "unused = sorted(m for m in sys.modules\n"
        "                if m.startswith(('horovod', 'components.train', 'tf_keras')))\n"
        "print('UNUSED=' + ','.join(unused[:5]))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=300, check=False
    )
    assert proc.returncode == 0, proc.stderr
    written = json.loads(out.read_text())
    assert written["accuracy"] == pytest.approx(trained_model.accuracy, abs=1e-6)
    assert written["loss"] == pytest.approx(trained_model.loss, rel=1e-4)
    assert f"accuracy={written['accuracy']:.4f}" in proc.stdout
    assert "UNUSED=\n" in proc.stdout


def _not_models(model_dir: str, tmp_path: Path) -> list[tuple[str, str]]:
    import tensorflow as tf

    plain = tf.Module()  # a SavedModel without a serving signature
    plain.v = tf.Variable(1.0)
    tf.saved_model.save(plain, str(tmp_path / "plain"))
    empty = tmp_path / "empty"
    empty.mkdir()
    corrupt = tmp_path / "corrupt"  # a real model whose saved_model.pb was damaged
    shutil.copytree(model_dir, corrupt)
    (corrupt / "saved_model.pb").write_bytes(b"\xff\xff not a protobuf")
    no_variables = tmp_path / "no-variables"
    shutil.copytree(model_dir, no_variables)
    (no_variables / "variables" / "variables.index").unlink()
    a_file = tmp_path / "file"
    a_file.write_text("x")
    return [
        (str(tmp_path / "nope"), "model directory is missing"),
        (str(empty), "not a SavedModel (no saved_model.pb)"),
        (str(corrupt), "saved_model.pb is corrupt"),
        (str(a_file), "not a directory"),
        (str(no_variables), "SavedModel is incomplete (no variables/variables.index)"),
        (str(tmp_path / "plain"), "SavedModel has no 'serving_default' signature"),
    ]


def test_bad_model_directories(trained_model, tmp_path: Path, capsys) -> None:
    for path, message in _not_models(trained_model.path, tmp_path):
        with pytest.raises(ModelError) as info:
            ev.evaluate(path, trained_model.dataset)
        assert path in str(info.value) and message in str(info.value)
    capsys.readouterr()
    for model, data, message in [
        (str(tmp_path / "nope"), trained_model.dataset, "model directory is missing"),
        (trained_model.path, str(tmp_path), "manifest.json: missing"),
    ]:
        with pytest.raises(SystemExit, match=f"^{ExitCode.BAD_INPUT}$"):
            ev.main(["--model", model, "--dataset", data])
        (failed,) = capsys.readouterr().err.splitlines()
        assert failed.startswith("FAILED: ") and message in failed


def test_the_recorded_digest_is_checked(trained_model, tmp_path: Path) -> None:
    """With the trainer's digest, evaluation scores only the model that was trained."""
    digest = trained_model.saved_model_sha256
    result = ev.evaluate(trained_model.path, trained_model.dataset, saved_model_sha256=digest)
    assert result.saved_model_sha256 == digest
    assert result.accuracy == pytest.approx(trained_model.accuracy, abs=1e-6)
    other = "0" * 64
    with pytest.raises(ModelError) as info:
        ev.evaluate(trained_model.path, trained_model.dataset, saved_model_sha256=other)
    assert str(info.value) == (
        f"{trained_model.path}: saved_model.pb has sha256 {digest}, but the trainer recorded "
        f"{other}: this is not the model that was trained"
    )
    with pytest.raises(ModelError, match="'nope' is not a sha256 hex digest"):
        ev.evaluate(trained_model.path, trained_model.dataset, saved_model_sha256="nope")
    args = ["--model", trained_model.path, "--dataset", trained_model.dataset]
    with pytest.raises(SystemExit, match=f"^{ExitCode.BAD_INPUT}$"):
        ev.main([*args, "--saved-model-sha256", other])


def test_component_function_logs_kfp_outputs(trained_model, tmp_path: Path, capsys) -> None:
    from kfp import dsl

    from components.evaluate.component import evaluate

    metrics = dsl.Metrics(uri=str(tmp_path / "metrics"))
    confusion = dsl.ClassificationMetrics(uri=str(tmp_path / "cm"))
    report = dsl.Markdown(uri=str(tmp_path / "report.md"))
    out = evaluate(
        dataset=dsl.Dataset(uri=trained_model.dataset),
        saved_model=dsl.Model(uri=trained_model.path),
        metrics=metrics,
        confusion_matrix=confusion,
        report=report,
    )
    assert out.accuracy == pytest.approx(trained_model.accuracy, abs=1e-6)
    assert metrics.metadata["accuracy"] == out.accuracy and metrics.metadata["loss"] == out.loss
    cm = confusion.metadata["confusionMatrix"]
    assert [c["displayName"] for c in cm["annotationSpecs"]] == [str(i) for i in range(10)]
    assert sum(sum(row["row"]) for row in cm["rows"]) == 400
    assert "| class | support | precision | recall |" in Path(report.path).read_text()
    assert report.metadata["saved_model_sha256"] == trained_model.saved_model_sha256
    # The digest the train component put in the Model artifact's metadata is verified: the
    # step ends on it in one FAILED line (components.common.failure), no traceback.
    capsys.readouterr()
    with pytest.raises(SystemExit) as stopped:
        evaluate(
            dataset=dsl.Dataset(uri=trained_model.dataset),
            saved_model=dsl.Model(
                uri=trained_model.path, metadata={"saved_model_sha256": "1" * 64}
            ),
            metrics=dsl.Metrics(uri=str(tmp_path / "metrics-2")),
            confusion_matrix=dsl.ClassificationMetrics(uri=str(tmp_path / "cm-2")),
            report=dsl.Markdown(uri=str(tmp_path / "report-2.md")),
        )
    assert stopped.value.code == ExitCode.BAD_INPUT
    out = capsys.readouterr()
    (line,) = [ln for ln in out.err.splitlines() if ln.startswith("FAILED: ")]
    assert "this is not the model that was trained" in line
    assert "Traceback" not in out.out + out.err


def test_component_compiles(tmp_path: Path) -> None:
    from kfp import compiler

    from components.evaluate.component import make_component

    package = tmp_path / "evaluate.yaml"
    compiler.Compiler().compile(make_component("example.com/evaluate:test"), str(package))
    text = package.read_text()
    assert "example.com/evaluate:test" in text
    assert "system.ClassificationMetrics" in text and "system.Markdown" in text


def test_any_classes_are_scored_and_named(tmp_path: Path) -> None:
    """A dataset of three named classes of colour images: the confusion matrix, the report and
    KFP's ClassificationMetrics carry the names; a model of another dataset is refused."""
    from kfp import dsl

    from components.common.model_files import saved_model_sha256
    from components.data_prep.prep import prepare
    from components.evaluate.component import evaluate
    from components.train.rank.model import build_model, export_saved_model

    image_folder(tmp_path / "images", {"cat": 12, "dog": 12, "emu": 12}, size=(10, 10))
    data = str(tmp_path / "ds")
    manifest = prepare(str(tmp_path / "images"), data, test_fraction=0.5)
    spec = dataset.read_manifest(data)
    model = build_model(0, "small", shape=(10, 10, 3), num_classes=3)
    export_saved_model(model, tmp_path / "m", spec.image, spec.classes)
    result = ev.evaluate(str(tmp_path / "m"), data)
    assert result.classes == ["cat", "dog", "emu"] and result.samples == spec.count("test")
    assert np.asarray(result.confusion_matrix).shape == (3, 3)
    support = [manifest["splits"]["test"]["class_counts"][c] for c in result.classes]
    assert np.asarray(result.confusion_matrix).sum(axis=1).tolist() == support
    report = result.to_markdown("m", "d")
    assert all(f"\n| {name} | " in report for name in ("cat", "dog", "emu"))
    confusion = dsl.ClassificationMetrics(uri=str(tmp_path / "cm"))
    evaluate(
        dataset=dsl.Dataset(uri=data),
        saved_model=dsl.Model(uri=str(tmp_path / "m")),
        metrics=dsl.Metrics(uri=str(tmp_path / "metrics")),
        confusion_matrix=confusion,
        report=dsl.Markdown(uri=str(tmp_path / "report.md")),
    )
    names = [c["displayName"] for c in confusion.metadata["confusionMatrix"]["annotationSpecs"]]
    assert names == ["cat", "dog", "emu"]
    digits = build_model(0, "small")  # 28x28x1, ten classes
    export_saved_model(
        digits, tmp_path / "digits", dataset.ImageSpec(28, 28, 1), list("0123456789")
    )
    with pytest.raises(ModelError, match="it was trained on another dataset"):
        ev.evaluate(str(tmp_path / "digits"), data)
    assert saved_model_sha256(tmp_path / "m") == result.saved_model_sha256
