"""Register, one registration at a time, on local disk and on gs:// (fake-gcs-server). The races
are in test_registry.py; the step in kfp.local, in tests/test_e2e_local.py."""

import hashlib
import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from components.common import model_files, storage
from components.common.dataset import DataError, read_manifest
from components.common.failure import ExitCode
from components.common.model_files import ModelError
from components.register import register as rg
from components.register.registry import METADATA_FILE, ModelStore
from components.register.serving import ServingFolder
from components.register.tests.registering import FIXED_TIME, register_run
from tests.conftest import TrainedModel


def _inputs_beside(model: TrainedModel, summary: str, root: str) -> tuple[Any, str]:
    """The model, its dataset and run summary where `root` is: copied to gs:// for a gs:// root."""
    if not storage.is_gcs(root):
        return model, summary
    inputs = f"{root}-inputs"
    storage.upload_dir(model.path, f"{inputs}/model", last="saved_model.pb")
    storage.upload_dir(model.dataset, f"{inputs}/dataset", last="manifest.json")
    storage.write_bytes(f"{inputs}/run_summary.json", Path(summary).read_bytes())
    moved = SimpleNamespace(path=f"{inputs}/model", dataset=f"{inputs}/dataset")
    return moved, f"{inputs}/run_summary.json"


def test_first_registration_has_the_serving_layout_and_metadata(
    trained_model, trained_summary, storage_root: str, tmp_path: Path
) -> None:
    model, summary = _inputs_beside(trained_model, trained_summary, storage_root)
    refs = {"trainer": "ghcr.io/x/trainer:1", "evaluate": "ghcr.io/x/evaluate:1"}
    decision = register_run(model, summary, storage_root, "run-1", 0.93, 0.25, image_refs=refs)
    assert (decision.registered, decision.promoted, decision.version) == (True, True, 1)
    assert decision.decision == (
        "registered as version 1; promoted to production: no production version yet"
    )
    base = storage.join(storage_root, "mnist-cnn")
    assert decision.version_uri == storage.join(base, "1")
    names = {uri[len(base) + 1 :].split("/")[0] for uri in storage.list_files(base)}
    assert names == {"1", "_aliases", "_claims", "_runs", "_serving"}  # no _staging left
    src = Path(trained_model.path)
    expected = {p.relative_to(src).as_posix() for p in src.rglob("*") if p.is_file()}
    assert set(storage.checksums(decision.version_uri)) == expected | {METADATA_FILE}
    folder = ServingFolder(ModelStore(storage_root, "mnist-cnn"))
    assert folder.versions() == [1] and folder.matches(1)  # the alias's version alone

    meta = json.loads(storage.read_bytes(storage.join(decision.version_uri, METADATA_FILE)))
    assert meta["version"] == 1 and meta["model_name"] == "mnist-cnn"
    assert meta["metrics"] == {"accuracy": 0.93, "loss": 0.25, "min_accuracy": 0.5}
    assert meta["dataset"]["uri"] == model.dataset
    assert meta["dataset"]["manifest_sha256"] == read_manifest(trained_model.dataset).sha256
    assert meta["dataset"]["counts"] == {"train": 400, "test": 400}
    assert meta["dataset"]["image"] == [28, 28, 1]
    assert meta["dataset"]["classes"] == [str(c) for c in range(10)]
    assert meta["run_summary"] == json.loads(Path(trained_summary).read_text())
    assert (meta["model"], meta["augment"]) == ("small", False)  # from the run summary
    assert meta["pipeline_run_id"] == "run-1" and meta["image_refs"] == refs
    assert meta["registered_at"] == FIXED_TIME.isoformat()
    assert meta["saved_model_sha256"] == trained_model.saved_model_sha256
    alias = json.loads(storage.read_bytes(storage.join(base, "_aliases", "production.json")))
    assert alias["version"] == 1 and alias["metrics"]["accuracy"] == 0.93
    assert "previous" not in alias

    local = model_files.fetch_model(decision.version_uri, tmp_path)
    served = model_files.load_serving(local, decision.version_uri)  # what TF Serving runs
    assert served.predict(np.zeros((2, 28, 28, 1), np.uint8)).shape == (2, 10)
    assert served.takes_bytes
    md = decision.to_markdown()
    assert "**registered as version 1; promoted" in md and f"`{decision.version_uri}`" in md


def test_champion_challenger(trained_model, trained_summary, storage_root: str) -> None:
    def reg(run_id: str, accuracy: float, loss: float) -> rg.Decision:
        return register_run(trained_model, trained_summary, storage_root, run_id, accuracy, loss)

    store = ModelStore(storage_root, "mnist-cnn")
    assert reg("run-a", 0.95, 0.20).version == 1
    worse = reg("run-b", 0.93, 0.10)
    assert (worse.registered, worse.promoted, worse.version) == (True, False, 2)
    assert worse.decision == (
        "registered as version 2; not promoted to production: "
        "accuracy 0.9300 does not beat 0.9500 of version 1"
    )
    assert (worse.champion_version, worse.champion_accuracy) == (1, 0.95)
    assert store.read_alias("production")[0]["version"] == 1

    better = reg("run-c", 0.97, 0.30)
    assert better.promoted and better.version == 3
    assert "accuracy 0.9700 > 0.9500 of version 1" in better.decision
    alias = store.read_alias("production")[0]
    assert alias["version"] == 3 and alias["previous"]["version"] == 1

    assert not reg("run-d", 0.97, 0.31).promoted  # a tie with a worse loss
    tie_better_loss = reg("run-e", 0.97, 0.29)
    assert tie_better_loss.promoted and "loss 0.2900 < 0.3000" in tie_better_loss.decision
    assert store.published_versions() == [1, 2, 3, 4, 5]
    assert store.read_alias("production")[0]["version"] == 5


def test_the_quality_gate_writes_nothing(trained_model, trained_summary, storage_root) -> None:
    decision = register_run(
        trained_model, trained_summary, storage_root, "run-1", 0.97, min_accuracy=0.98
    )
    assert (decision.registered, decision.promoted, decision.version) == (False, False, 0)
    assert decision.version_uri == ""
    assert decision.decision == "not registered: accuracy 0.9700 < minimum 0.9800"
    assert "registered: no" in decision.to_markdown()
    assert storage.list_files(storage_root) == [] and not Path(storage_root).exists()


def test_a_rerun_returns_its_version_and_finishes_a_half_done_one(
    trained_model, trained_summary, storage_root: str
) -> None:
    store = ModelStore(storage_root, "mnist-cnn")
    # The state a crash between claiming and publishing leaves behind.
    assert store.claim_for_run("run-1", None, FIXED_TIME.isoformat()) == 1
    assert store.published_versions() == []
    first = register_run(trained_model, trained_summary, storage_root, "run-1", 0.95)
    assert first.version == 1 and first.promoted  # finished, not duplicated
    again = register_run(trained_model, trained_summary, storage_root, "run-1", 0.95)
    assert again.registered and again.version == 1 and again.promoted
    assert again.decision == f"already registered by run run-1 as version 1: {first.decision}"
    assert store.claimed_versions() == [1] and store.published_versions() == [1]
    # A rerun whose (changed) gate would now fail still reports the version it made.
    rerun = register_run(
        trained_model, trained_summary, storage_root, "run-1", 0.95, min_accuracy=0.99
    )
    assert rerun.version == 1


def _summary_with(tmp_path: Path, name: str, summary: str, **changes) -> str:
    """A copy of the run summary `summary` with `changes` (None: the key removed)."""
    record = {**json.loads(Path(summary).read_text()), **changes}
    path = tmp_path / name
    path.write_text(json.dumps({k: v for k, v in record.items() if v is not None}))
    return str(path)


def _bad_cases(model: TrainedModel, summary: str, tmp_path: Path):
    (tmp_path / "empty-model").mkdir()
    no_variables = Path(shutil.copytree(model.path, tmp_path / "no-variables"))
    (no_variables / "variables" / "variables.index").unlink()
    swapped = Path(shutil.copytree(model.path, tmp_path / "swapped"))
    (swapped / "saved_model.pb").write_bytes((swapped / "saved_model.pb").read_bytes() + b"\0")
    actual = hashlib.sha256((swapped / "saved_model.pb").read_bytes()).hexdigest()
    (tmp_path / "summary.txt").write_text("not json")
    (tmp_path / "list.json").write_text("[1, 2]")
    no_digest = _summary_with(tmp_path, "no-digest.json", summary, saved_model_sha256=None)
    bad_digest = _summary_with(tmp_path, "bad-digest.json", summary, saved_model_sha256="abc")
    digest, other = model.saved_model_sha256, "0" * 64
    return [
        ({"model": str(tmp_path / "missing")}, ModelError, "model directory is missing"),
        ({"model": str(tmp_path / "empty-model")}, ModelError, "not a SavedModel (no saved_mod"),
        ({"model": str(no_variables)}, ModelError, "incomplete (no variables/variables.index)"),
        (
            {"model": str(swapped)},
            ModelError,
            (
                f"not registering 'mnist-cnn': {swapped}: saved_model.pb has sha256 {actual}, but "
                f"the trainer recorded {digest}: this is not the model that was trained"
            ),
        ),
        (
            {"summary": no_digest},
            ModelError,
            (
                "not registering 'mnist-cnn': no saved_model_sha256 recorded, neither in the run "
                f"summary {no_digest} nor in the Model artifact's metadata"
            ),
        ),
        (
            {"summary": bad_digest},
            ModelError,
            f"run summary {bad_digest}: saved_model_sha256 'abc' is not a sha256 hex digest",
        ),
        (
            {"saved_model_sha256": other},
            ModelError,
            (
                f"the recorded saved_model_sha256 values disagree: the run summary {summary} "
                f"records {digest}, the Model artifact's metadata records {other}"
            ),
        ),
        ({"summary": str(tmp_path / "nope.json")}, ValueError, "nope.json: missing"),
        ({"summary": str(tmp_path / "summary.txt")}, ValueError, "summary.txt: not valid JSON"),
        ({"summary": str(tmp_path / "list.json")}, ValueError, "expected a JSON object"),
        ({"data": str(tmp_path)}, DataError, "manifest.json: missing"),
        ({"model_name": "../escape"}, ValueError, "model_name must be 1-63 lowercase letters"),
        ({"alias": "prod/x"}, ValueError, "alias 'prod/x' is not allowed"),
        ({"accuracy": 1.5}, ValueError, "accuracy must be a finite number in 0..1.0, got 1.5"),
        ({"accuracy": math.nan}, ValueError, "accuracy must be a finite number"),
        ({"loss": -1.0}, ValueError, "loss must be a finite number >= 0"),
        ({"min_accuracy": -0.1}, ValueError, "min_accuracy must be >= 0, got -0.1"),
        ({"pipeline_run_id": " "}, ValueError, "pipeline_run_id is empty"),
        ({"registry_root": ""}, ValueError, "registry_root is empty: set it"),
    ]


def test_bad_input_fails_clearly_and_writes_nothing(
    trained_model, trained_summary, tmp_path: Path
) -> None:
    """Including a model that is not the trained one: saved_model.pb must hash to the digest the
    trainer recorded."""
    root = tmp_path / "registry"
    for change, error, message in _bad_cases(trained_model, trained_summary, tmp_path):
        kwargs = {
            "model": trained_model.path,
            "summary": trained_summary,
            "data": trained_model.dataset,
            "accuracy": 0.99,
            "loss": 0.1,
            "registry_root": str(root),
            "pipeline_run_id": "run-1",
            "min_accuracy": 0.5,
            **change,
        }
        args = [kwargs.pop(k) for k in ("model", "summary", "data", "accuracy", "loss")]
        with pytest.raises(error) as info:
            rg.register(*args, **kwargs)
        assert message in str(info.value), (message, str(info.value))
        assert "\n" not in str(info.value) and not root.exists(), message


def test_the_model_artifacts_digest_is_enough(trained_model, trained_summary, tmp_path) -> None:
    """A run summary without the digest: the Model artifact's metadata still vouches for it."""
    bare = _summary_with(tmp_path, "bare.json", trained_summary, saved_model_sha256=None)
    root, digest = str(tmp_path / "registry"), trained_model.saved_model_sha256
    decision = register_run(trained_model, bare, root, "run-1", 0.9, saved_model_sha256=digest)
    assert decision.registered and decision.version == 1
    assert ModelStore(root, "mnist-cnn").read_metadata(1)["saved_model_sha256"] == digest


def cli_args(trained_model: Any, summary: str, root: Path, out: Path) -> list[str]:
    return [
        "--model",
        trained_model.path,
        "--run-summary",
        summary,
        "--dataset",
        trained_model.dataset,
        "--accuracy",
        "0.95",
        "--loss",
        "0.2",
        "--registry-root",
        str(root),
        "--pipeline-run-id",
        "cli-run",
        "--min-accuracy",
        "0.9",
        "--image-refs",
        '{"register": "img:1"}',
        "--output-json",
        str(out),
    ]


def test_the_cli_registers_without_tensorflow(
    trained_model, trained_summary, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The register image carries no TensorFlow: a whole registration through the CLI, in a
    fresh process, must not import it (not even lazily). Its JSON is renamed into place whole."""
    root, out = tmp_path / "registry", tmp_path / "decision.json"
    args = cli_args(trained_model, trained_summary, root, out)
    code = (
        "import sys\n"
        "from components.register.register import main\n"
        f"assert main({args!r}) == 0\n"
        "assert 'tensorflow' not in sys.modules, 'registration imported TensorFlow'\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "registered as version 1; promoted to production" in proc.stdout
    assert json.loads(out.read_text())["version"] == 1
    assert (root / "mnist-cnn" / "1" / "saved_model.pb").is_file()
    renamed, replace = [], os.replace
    monkeypatch.setattr(os, "replace", lambda src, dst: renamed.append(dst) or replace(src, dst))
    assert rg.main(args) == 0  # a rerun: its version back
    assert str(out) in map(str, renamed) and json.loads(out.read_text())["version"] == 1


@pytest.mark.parametrize(
    ("option", "value", "line"),
    [
        ("--image-refs", "[1]", "image_refs must be a JSON object of strings, got '[1]'"),
        (
            "--model",
            "{tmp}/none",
            "not registering 'mnist-cnn': {tmp}/none: model directory is missing",
        ),
        ("--accuracy", "1.5", "accuracy must be a finite number in 0..1.0, got 1.5"),
        ("--registry-root", "gs://", "gs:// URI has no bucket: 'gs://'"),
    ],
)
def test_bad_input_to_the_cli_is_one_line_and_writes_nothing(
    trained_model, trained_summary, tmp_path: Path, option: str, value: str, line: str
) -> None:
    root, out = tmp_path / "registry", tmp_path / "decision.json"
    args = cli_args(trained_model, trained_summary, root, out)
    args[args.index(option) + 1] = value.replace("{tmp}", str(tmp_path))
    command = [sys.executable, "-m", "components.register.register", *args]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert (proc.returncode, proc.stdout) == (ExitCode.BAD_INPUT, "")
    assert proc.stderr.splitlines() == ["FAILED: " + line.replace("{tmp}", str(tmp_path))]
    assert not root.exists() and not out.exists()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{nope", "image_refs is not valid JSON"),
        ('["a"]', "JSON object of strings"),
        ('{"a": 1}', "JSON object of strings"),
    ],
)
def test_parse_image_refs_rejects_bad_values(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        rg.parse_image_refs(text)
    assert rg.parse_image_refs('{"trainer": "img:1"}') == {"trainer": "img:1"}
    assert rg.parse_image_refs("") == {}


def test_the_component_function(
    trained_model, trained_summary, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from kfp import dsl

    from components.register.component import make_component

    def call(
        digest: str,
        registry: str,
        decision: dsl.Markdown,
        accuracy: float = 0.95,
        min_accuracy: float = 0.9,
    ):  # as the component calls it
        return rg.register_model_step(
            saved_model=dsl.Model(uri=trained_model.path, metadata={"saved_model_sha256": digest}),
            run_summary=dsl.Artifact(uri=trained_summary),
            dataset=dsl.Dataset(uri=trained_model.dataset),
            accuracy=accuracy,
            loss=0.2,
            confusion_matrix=dsl.ClassificationMetrics(metadata=_evaluation(10)),
            model_name="mnist-cnn",
            registry_root=str(tmp_path / registry),
            min_accuracy=min_accuracy,
            pipeline_run_id="kfp-run",
            image_refs={"register": "img:1"},
            decision=decision,
        )

    decision = dsl.Markdown(uri=str(tmp_path / "decision.md"))
    registered, promoted, version, text, uri = call(
        trained_model.saved_model_sha256, "registry", decision
    )
    assert (registered, promoted, version) == (True, True, 1)
    assert uri == str(tmp_path / "registry" / "mnist-cnn" / "1")
    assert text in Path(decision.path).read_text() and decision.metadata["version"] == 1
    meta = ModelStore(str(tmp_path / "registry"), "mnist-cnn").read_metadata(1)
    assert (meta["image_refs"], meta["pipeline_run_id"]) == ({"register": "img:1"}, "kfp-run")
    # The Model artifact's metadata digest (set by the train component) is checked too.
    other = "f" * 64
    with pytest.raises(ModelError, match=f"the Model artifact's metadata records {other}"):
        call(other, "registry-2", dsl.Markdown(uri=str(tmp_path / "decision-2.md")))
    assert not (tmp_path / "registry-2").exists()

    assert "WARNING" not in capsys.readouterr().out
    # min_accuracy 0 lets a model below chance through (the user's choice): the step says so
    low = call(
        trained_model.saved_model_sha256,
        "registry-3",
        dsl.Markdown(uri=str(tmp_path / "decision-3.md")),
        accuracy=0.05,
        min_accuracy=0,
    )
    assert low[0] and capsys.readouterr().out.splitlines() == [
        "register: WARNING: mnist-cnn version 1 was registered with a test accuracy of 0.0500, "
        "below chance (0.1000, 1 of the 10 classes the evaluation scored): min_accuracy 0 let it "
        "through"
    ]
    component = make_component("example.com/register:test")  # compiled: test_pipeline_compile
    assert set(component.component_spec.outputs) == {
        "decision",
        "registered",
        "promoted",
        "version",
        "decision_text",
        "version_uri",
    }


def test_a_model_of_other_images_or_classes_is_not_registered_under_the_same_name(
    trained_model, trained_summary, tmp_path: Path
) -> None:
    """The production version's clients send 28x28 digits of ten classes: a model of another
    dataset under the same model_name would break them, so it is refused in one line, with
    nothing written; under a name of its own it registers."""
    from components.common.tests.datasets import image_folder
    from components.data_prep.prep import prepare

    root = str(tmp_path / "registry")
    register_run(trained_model, trained_summary, root, "run-a", 0.95)
    image_folder(tmp_path / "images", {"cat": 6, "dog": 6}, size=(28, 28), channels=1)
    faces = str(tmp_path / "faces")
    prepare(str(tmp_path / "images"), faces, test_fraction=0.5)
    before = sorted(p.relative_to(root).as_posix() for p in Path(root).rglob("*"))
    with pytest.raises(ValueError) as refused:
        rg.register(
            trained_model.path,
            trained_summary,
            faces,
            0.97,
            0.1,
            registry_root=root,
            pipeline_run_id="run-b",
        )
    assert str(refused.value) == (
        "not registering 'mnist-cnn': its production version 1 takes 28x28x1 images of 10 "
        "classes (0, 1, 2, 3, …), this model 28x28x1 images of 2 classes (cat, dog); the served "
        "model's clients could not use it: register it under a model_name of its own"
    )
    assert sorted(p.relative_to(root).as_posix() for p in Path(root).rglob("*")) == before
    decision = rg.register(
        trained_model.path,
        trained_summary,
        faces,
        0.97,
        0.1,
        registry_root=root,
        pipeline_run_id="run-b",
        model_name="faces",
    )
    assert decision.promoted and decision.version == 1


def _evaluation(classes: int) -> dict[str, Any]:
    """A ClassificationMetrics artifact's metadata, as the evaluate step logs its matrix."""
    from kfp.dsl import ClassificationMetrics

    metrics = ClassificationMetrics(name="confusion_matrix")
    matrix = [[1 if i == j else 0 for j in range(classes)] for i in range(classes)]
    metrics.log_confusion_matrix([str(c) for c in range(classes)], matrix)
    return dict(metrics.metadata)


@pytest.mark.parametrize(
    ("classes", "accuracy", "registered", "warns"),
    [
        (10, 0.0, True, True),
        (10, 0.0999, True, True),
        (10, 0.1, True, False),  # at chance: no warning
        (3, 0.3, True, True),  # chance from the evaluation's classes, not a constant 10
        (3, 0.34, True, False),
        (10, 0.0, False, False),  # not registered: nothing to warn of
    ],
)
def test_a_model_registered_below_chance_gets_a_warning_line(
    classes: int, accuracy: float, registered: bool, warns: bool
) -> None:
    result = rg.Decision(registered, True, 1 if registered else 0, "d", "u", "m", accuracy, 2.3)
    warning = rg.below_chance(result, 0.0, _evaluation(classes))
    assert (warning is not None) == warns, warning
    if warning:
        chance = f"{1 / classes:.4f}"
        assert warning == (
            f"register: WARNING: m version 1 was registered with a test accuracy of "
            f"{accuracy:.4f}, below chance ({chance}, 1 of the {classes} classes the evaluation "
            "scored): min_accuracy 0 let it through"
        )
