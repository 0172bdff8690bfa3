"""Register: gate, champion/challenger, serving layout, idempotency, concurrency, bad input, GCS."""

import hashlib
import json
import math
import shutil
import subprocess
import sys
import threading
from datetime import datetime, timezone
from pathlib import Path

import pytest

from components.common import storage
from components.common.dataset import DataError, read_manifest
from components.common.model_files import ModelError
from components.register import register as rg
from components.register.registry import METADATA_FILE, ModelStore

FIXED_TIME = datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone.utc)


def _register(
    trained_model, summary: str, root: str, run_id: str, accuracy: float, loss: float = 0.3, **kw
):
    kw.setdefault("min_accuracy", 0.5)
    kw.setdefault("now", lambda: FIXED_TIME)
    return rg.register(
        trained_model.path,
        summary,
        trained_model.dataset,
        accuracy,
        loss,
        registry_root=root,
        pipeline_run_id=run_id,
        **kw,
    )


def test_first_registration_has_the_serving_layout_and_metadata(
    trained_model, summary, tmp_path: Path
) -> None:
    root = str(tmp_path / "registry")
    refs = {"trainer": "ghcr.io/x/trainer:1", "evaluate": "ghcr.io/x/evaluate:1"}
    decision = _register(trained_model, summary, root, "run-1", 0.93, 0.25, image_refs=refs)
    assert decision.registered and decision.promoted and decision.version == 1
    assert (
        decision.decision
        == "registered as version 1; promoted to production: no production version yet"
    )
    base = tmp_path / "registry" / "mnist-cnn"
    assert decision.version_uri == str(base / "1")
    assert sorted(p.name for p in base.iterdir()) == [
        "1", "_aliases", "_claims", "_runs", "_serving",
    ]  # fmt: skip
    serving = base / "_serving" / "production"  # the alias's serving folder: version 1 alone
    assert [p.name for p in serving.iterdir()] == ["1"]
    assert (serving / "1" / "saved_model.pb").read_bytes() == (
        base / "1" / "saved_model.pb"
    ).read_bytes()
    assert (base / "1" / "saved_model.pb").is_file() and (base / "1" / "variables").is_dir()

    meta = json.loads((base / "1" / METADATA_FILE).read_text())
    assert meta["version"] == 1 and meta["model_name"] == "mnist-cnn"
    assert meta["metrics"] == {"accuracy": 0.93, "loss": 0.25, "min_accuracy": 0.5}
    assert meta["dataset"]["manifest_sha256"] == read_manifest(trained_model.dataset).sha256
    assert meta["dataset"]["counts"] == {"train": 400, "test": 400}
    assert meta["run_summary"] == json.loads(Path(summary).read_text())
    assert (meta["model"], meta["augment"]) == ("small", False)  # from the run summary
    assert meta["pipeline_run_id"] == "run-1" and meta["image_refs"] == refs
    assert meta["registered_at"] == FIXED_TIME.isoformat()
    assert meta["saved_model_sha256"] == trained_model.saved_model_sha256

    alias = json.loads((base / "_aliases" / "production.json").read_text())
    assert (
        alias["version"] == 1 and alias["metrics"]["accuracy"] == 0.93 and "previous" not in alias
    )

    import numpy as np
    import tensorflow as tf

    served = tf.saved_model.load(decision.version_uri)  # what TF Serving would load
    out = served.signatures["serving_default"](tf.constant(np.zeros((2, 28, 28), np.float32)))
    assert next(iter(out.values())).shape == (2, 10)
    md = decision.to_markdown()
    assert "**registered as version 1; promoted" in md and f"`{decision.version_uri}`" in md


def test_champion_challenger(trained_model, summary, tmp_path: Path) -> None:
    root = str(tmp_path / "registry")
    store = ModelStore(root, "mnist-cnn")
    first = _register(trained_model, summary, root, "run-a", 0.95, 0.20)
    worse = _register(trained_model, summary, root, "run-b", 0.93, 0.10)
    assert (worse.registered, worse.promoted, worse.version) == (True, False, 2)
    assert worse.decision == (
        "registered as version 2; not promoted to production: "
        "accuracy 0.9300 does not beat 0.9500 of version 1"
    )
    assert (worse.champion_version, worse.champion_accuracy) == (1, 0.95)
    assert store.read_alias("production")[0]["version"] == first.version == 1

    better = _register(trained_model, summary, root, "run-c", 0.97, 0.30)
    assert better.promoted and better.version == 3
    assert "accuracy 0.9700 > 0.9500 of version 1" in better.decision
    alias = store.read_alias("production")[0]
    assert alias["version"] == 3 and alias["previous"]["version"] == 1

    tie_worse_loss = _register(trained_model, summary, root, "run-d", 0.97, 0.31)
    assert not tie_worse_loss.promoted
    tie_better_loss = _register(trained_model, summary, root, "run-e", 0.97, 0.29)
    assert tie_better_loss.promoted and "loss 0.2900 < 0.3000" in tie_better_loss.decision
    assert store.published_versions() == [1, 2, 3, 4, 5]
    assert store.read_alias("production")[0]["version"] == 5


def test_quality_gate_failure_writes_nothing(trained_model, summary, tmp_path: Path) -> None:
    root = tmp_path / "registry"
    decision = _register(trained_model, summary, str(root), "run-1", 0.97, min_accuracy=0.98)
    assert (decision.registered, decision.promoted, decision.version, decision.version_uri) == (
        False,
        False,
        0,
        "",
    )
    assert decision.decision == "not registered: accuracy 0.9700 < minimum 0.9800"
    assert "registered: no" in decision.to_markdown()
    assert not root.exists()


def test_rerunning_a_run_does_not_duplicate(trained_model, summary, tmp_path: Path) -> None:
    root = str(tmp_path / "registry")
    first = _register(trained_model, summary, root, "run-1", 0.95)
    again = _register(trained_model, summary, root, "run-1", 0.95)
    assert again.registered and again.version == first.version == 1 and again.promoted
    assert again.decision == f"already registered by run run-1 as version 1: {first.decision}"
    store = ModelStore(root, "mnist-cnn")
    assert store.claimed_versions() == [1] and store.published_versions() == [1]
    # A rerun whose (changed) gate would now fail still reports the version it made.
    assert _register(trained_model, summary, root, "run-1", 0.95, min_accuracy=0.99).version == 1


def test_a_half_finished_registration_is_completed_not_duplicated(
    trained_model, summary, tmp_path: Path
) -> None:
    root = str(tmp_path / "registry")
    store = ModelStore(root, "mnist-cnn")
    # The state a crash between claiming and publishing leaves behind.
    version = store.claim_next_version({"pipeline_run_id": "run-1"})
    assert store.bind_run("run-1", {"pipeline_run_id": "run-1", "version": version})
    assert store.published_versions() == []
    decision = _register(trained_model, summary, root, "run-1", 0.95)
    assert decision.version == 1 and decision.promoted
    assert store.claimed_versions() == [1] and store.published_versions() == [1]


def _summary_with(tmp_path: Path, name: str, summary: str, **changes) -> str:
    """A copy of the run summary `summary` with `changes` (None: the key removed)."""
    record = {**json.loads(Path(summary).read_text()), **changes}
    path = tmp_path / name
    path.write_text(json.dumps({k: v for k, v in record.items() if v is not None}))
    return str(path)


def _bad_cases(trained_model, summary: str, tmp_path: Path):
    empty = tmp_path / "empty-model"
    empty.mkdir()
    no_variables = tmp_path / "no-variables"
    shutil.copytree(trained_model.path, no_variables)
    (no_variables / "variables" / "variables.index").unlink()
    not_json = tmp_path / "summary.txt"
    not_json.write_text("not json")
    a_list = tmp_path / "list.json"
    a_list.write_text("[1, 2]")
    no_digest = _summary_with(tmp_path, "no-digest.json", summary, saved_model_sha256=None)
    bad_digest = _summary_with(tmp_path, "bad-digest.json", summary, saved_model_sha256="abc")
    other = "0" * 64
    ok = {"model": trained_model.path, "summary": summary, "data": trained_model.dataset}
    return [
        ({**ok, "model": str(tmp_path / "missing")}, {}, ModelError, "model directory is missing"),
        ({**ok, "model": str(empty)}, {}, ModelError, "not a SavedModel (no saved_model.pb)"),
        (
            {**ok, "model": str(no_variables)},
            {},
            ModelError,
            "SavedModel is incomplete (no variables/variables.index)",
        ),
        (
            {**ok, "summary": no_digest},
            {},
            ModelError,
            "not registering 'mnist-cnn': no saved_model_sha256 recorded, neither in the run "
            f"summary {no_digest} nor in the Model artifact's metadata",
        ),
        (
            {**ok, "summary": bad_digest},
            {},
            ModelError,
            f"run summary {bad_digest}: saved_model_sha256 'abc' is not a sha256 hex digest",
        ),
        (
            ok,
            {"saved_model_sha256": other},
            ModelError,
            "the recorded saved_model_sha256 values disagree: the run summary "
            f"{summary} records {trained_model.saved_model_sha256}, the Model artifact's "
            f"metadata records {other}",
        ),
        ({**ok, "summary": str(tmp_path / "nope.json")}, {}, ValueError, "nope.json: missing"),
        ({**ok, "summary": str(not_json)}, {}, ValueError, "summary.txt: not valid JSON"),
        ({**ok, "summary": str(a_list)}, {}, ValueError, "expected a JSON object"),
        ({**ok, "data": str(tmp_path)}, {}, DataError, "manifest.json: missing"),
        (ok, {"model_name": "../escape"}, ValueError, "model name '../escape' is not allowed"),
        (ok, {"alias": "prod/x"}, ValueError, "alias 'prod/x' is not allowed"),
        (ok, {"accuracy": 1.5}, ValueError, "accuracy must be a finite number in 0..1.0, got 1.5"),
        (ok, {"accuracy": math.nan}, ValueError, "accuracy must be a finite number"),
        (ok, {"loss": -1.0}, ValueError, "loss must be a finite number >= 0"),
        (ok, {"min_accuracy": -0.1}, ValueError, "min_accuracy must be a finite number"),
        (ok, {"pipeline_run_id": " "}, ValueError, "pipeline_run_id is empty"),
    ]


def test_bad_input_fails_clearly_and_writes_nothing(trained_model, summary, tmp_path: Path) -> None:
    root = tmp_path / "registry"
    for paths, overrides, error, message in _bad_cases(trained_model, summary, tmp_path):
        kwargs = {"accuracy": 0.99, "loss": 0.1, "pipeline_run_id": "run-1", "min_accuracy": 0.5}
        kwargs.update(overrides)
        accuracy, loss = kwargs.pop("accuracy"), kwargs.pop("loss")
        with pytest.raises(error) as info:
            rg.register(
                paths["model"],
                paths["summary"],
                paths["data"],
                accuracy,
                loss,
                registry_root=str(root),
                **kwargs,
            )
        assert message in str(info.value), (message, str(info.value))
        assert not root.exists(), message
    with pytest.raises(ValueError, match="registry root is empty"):
        rg.register(
            trained_model.path,
            summary,
            trained_model.dataset,
            0.9,
            0.1,
            registry_root="",
            pipeline_run_id="r",
        )


def test_a_model_that_is_not_the_trained_one_is_refused(
    trained_model, summary, tmp_path: Path
) -> None:
    """saved_model.pb must hash to the digest the trainer recorded; else nothing is written."""
    swapped = tmp_path / "swapped-model"
    shutil.copytree(trained_model.path, swapped)
    pb = swapped / "saved_model.pb"
    pb.write_bytes(pb.read_bytes() + b"\0")  # still a complete layout, other bytes
    actual = hashlib.sha256(pb.read_bytes()).hexdigest()
    root = tmp_path / "registry"
    with pytest.raises(ModelError) as info:
        rg.register(
            str(swapped),
            summary,
            trained_model.dataset,
            0.99,
            0.1,
            registry_root=str(root),
            pipeline_run_id="run-1",
            min_accuracy=0.5,
        )
    assert str(info.value) == (
        f"not registering 'mnist-cnn': {swapped}: saved_model.pb has sha256 {actual}, but the "
        f"trainer recorded {trained_model.saved_model_sha256}: this is not the model that was "
        "trained"
    )
    assert not root.exists()


def test_the_model_artifacts_digest_is_enough(trained_model, summary, tmp_path: Path) -> None:
    """A run summary without the digest: the Model artifact's metadata still vouches for it."""
    bare = _summary_with(tmp_path, "bare.json", summary, saved_model_sha256=None)
    root = str(tmp_path / "registry")
    digest = trained_model.saved_model_sha256
    decision = _register(trained_model, bare, root, "run-1", 0.9, saved_model_sha256=digest)
    assert decision.registered and decision.version == 1
    assert ModelStore(root, "mnist-cnn").read_metadata(1)["saved_model_sha256"] == digest


def test_registration_runs_without_tensorflow(trained_model, summary, tmp_path: Path) -> None:
    """The register image carries no TensorFlow: a whole registration, in a fresh process,
    must not import it (not even lazily)."""
    root = tmp_path / "registry"
    args = [
        *("--model", trained_model.path, "--run-summary", summary),
        *("--dataset", trained_model.dataset, "--accuracy", "0.9", "--loss", "0.2"),
        *("--registry-root", str(root), "--pipeline-run-id", "no-tf", "--min-accuracy", "0.5"),
    ]
    code = (
        "import sys\n"
        "from components.register.register import main\n"
        f"assert main({args!r}) == 0\n"
        "assert 'tensorflow' not in sys.modules, 'registration imported TensorFlow'\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.returncode == 0, proc.stderr
    assert "registered as version 1; promoted to production" in proc.stdout
    assert (root / "mnist-cnn" / "1" / "saved_model.pb").is_file()


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


def test_concurrent_registrations_in_threads(trained_model, summary, tmp_path: Path) -> None:
    root = str(tmp_path / "registry")
    accuracies = [0.91, 0.97, 0.93, 0.99, 0.92, 0.95, 0.94, 0.96]
    results: dict[str, rg.Decision] = {}
    errors: list[BaseException] = []
    barrier = threading.Barrier(len(accuracies) + 3)

    def work(run_id: str, accuracy: float) -> None:
        barrier.wait()
        try:
            results[run_id] = _register(trained_model, summary, root, run_id, accuracy)
        except BaseException as exc:  # reported below
            errors.append(exc)

    jobs = [(f"run-{i}", a) for i, a in enumerate(accuracies)] + [("same-run", 0.5)] * 3
    threads = [threading.Thread(target=work, args=job) for job in jobs]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not errors, errors
    store = ModelStore(root, "mnist-cnn")
    versions = [results[f"run-{i}"].version for i in range(len(accuracies))]
    assert len(set(versions)) == len(versions)  # never the same number twice
    assert store.published_versions() == sorted(versions + [results["same-run"].version])
    assert len(store.published_versions()) == len(accuracies) + 1  # the same run made one version
    best = versions[accuracies.index(max(accuracies))]
    assert store.read_alias("production")[0]["version"] == best
    assert results["run-3"].promoted
    for v in store.published_versions():
        assert store.read_metadata(v)["version"] == v


def test_cli(trained_model, summary, tmp_path: Path, capsys) -> None:
    root, out = str(tmp_path / "registry"), tmp_path / "decision.json"
    args = [
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
        root,
        "--pipeline-run-id",
        "cli-run",
        "--min-accuracy",
        "0.9",
        "--image-refs",
        '{"register": "img:1"}',
        "--output-json",
        str(out),
    ]
    assert rg.main(args) == 0
    assert "registered as version 1; promoted to production" in capsys.readouterr().out
    assert json.loads(out.read_text())["version"] == 1
    assert rg.main([*args[:-2], "--image-refs", "[1]"]) == 2
    assert "image_refs must be a JSON object" in capsys.readouterr().err
    assert rg.main([*args[:1], str(tmp_path / "none"), *args[2:]]) == 2
    assert "model directory is missing" in capsys.readouterr().err


def test_gcs_registry(trained_model, summary, gcs_uri: str) -> None:
    """Registration with every input and the registry on gs://: the layout, the metadata,
    idempotency, the gate and the alias. (The races on gs:// are in test_registry_gcs.py.)"""
    root = f"{gcs_uri}/registry"
    model_uri = f"{gcs_uri}/artifacts/model"
    storage.upload_dir(trained_model.path, model_uri, last="saved_model.pb")
    data_uri = f"{gcs_uri}/artifacts/dataset"
    storage.upload_dir(trained_model.dataset, data_uri, last="manifest.json")
    summary_uri = f"{gcs_uri}/artifacts/run_summary.json"
    storage.write_bytes(summary_uri, Path(summary).read_bytes())

    def reg(run_id: str, accuracy: float, **kw):
        return rg.register(
            model_uri,
            summary_uri,
            data_uri,
            accuracy,
            0.2,
            registry_root=root,
            pipeline_run_id=run_id,
            min_accuracy=0.9,
            **kw,
        )

    first = reg("run-1", 0.95)
    assert first.version_uri == f"{root}/mnist-cnn/1" and first.promoted
    files = storage.list_files(f"{root}/mnist-cnn/1")
    assert f"{root}/mnist-cnn/1/saved_model.pb" in files
    assert any(f.endswith("variables/variables.index") for f in files)
    local_files = [p for p in Path(trained_model.path).rglob("*") if p.is_file()]
    assert len(files) == len(local_files) + 1  # the SavedModel plus the metadata file
    meta = json.loads(storage.read_bytes(f"{root}/mnist-cnn/1/{METADATA_FILE}"))
    assert meta["pipeline_run_id"] == "run-1" and meta["dataset"]["uri"] == data_uri

    assert reg("run-1", 0.95).version == 1  # no duplicate
    assert not reg("run-2", 0.80).registered  # gate
    second = reg("run-3", 0.96)
    assert second.version == 2 and second.promoted
    store = ModelStore(root, "mnist-cnn")
    assert store.published_versions() == [1, 2]
    assert store.read_alias("production")[0]["version"] == 2

    assert storage.list_files(f"{root}/mnist-cnn/_staging") == []


def test_component_function_and_compile(trained_model, summary, tmp_path: Path) -> None:
    from kfp import compiler, dsl

    from components.register.component import make_component
    from components.register.register import register_step

    def call(digest: str, registry: str, decision: dsl.Markdown):  # as the component calls it
        return register_step(
            model=dsl.Model(uri=trained_model.path, metadata={"saved_model_sha256": digest}),
            run_summary=dsl.Artifact(uri=summary),
            dataset=dsl.Dataset(uri=trained_model.dataset),
            accuracy=0.95,
            loss=0.2,
            model_name="mnist-cnn",
            registry_root=str(tmp_path / registry),
            min_accuracy=0.9,
            pipeline_run_id="kfp-run",
            image_refs='{"register": "img:1"}',
            decision=decision,
        )

    decision = dsl.Markdown(uri=str(tmp_path / "decision.md"))
    out = call(trained_model.saved_model_sha256, "registry", decision)  # as train records it
    assert (out.registered, out.promoted, out.version) == (True, True, 1)
    assert out.version_uri == str(tmp_path / "registry" / "mnist-cnn" / "1")
    assert (
        out.decision_text in Path(decision.path).read_text() and decision.metadata["version"] == 1
    )
    # The Model artifact's metadata digest (set by the train component) is checked too.
    other = "f" * 64
    with pytest.raises(ModelError, match=f"the Model artifact's metadata records {other}"):
        call(other, "registry-2", dsl.Markdown(uri=str(tmp_path / "decision-2.md")))
    assert not (tmp_path / "registry-2").exists()

    component = make_component("example.com/register:test")

    @dsl.pipeline(name="register-only")
    def only_register(uri: str = "gs://b/x"):
        model = dsl.importer(artifact_uri=uri, artifact_class=dsl.Model)
        summary_ = dsl.importer(artifact_uri=uri, artifact_class=dsl.Artifact)
        data = dsl.importer(artifact_uri=uri, artifact_class=dsl.Dataset)
        component(
            model=model.output,
            run_summary=summary_.output,
            dataset=data.output,
            accuracy=0.9,
            loss=0.1,
            model_name="m",
            registry_root="gs://b/r",
            min_accuracy=0.5,
            pipeline_run_id=dsl.PIPELINE_JOB_ID_PLACEHOLDER,
            image_refs="{}",
        )

    package = tmp_path / "p.yaml"
    compiler.Compiler().compile(only_register, str(package))
    assert "example.com/register:test" in package.read_text()


@pytest.mark.e2e  # a three-step pipeline through kfp.local
def test_kfp_local_pipeline_prep_evaluate_register(trained_model, summary, tmp_path: Path) -> None:
    """The three components wired as the pipeline will wire them, run by kfp.local subprocesses."""
    from kfp import dsl, local

    from components.data_prep.component import make_component as data_prep
    from components.evaluate.component import make_component as evaluate
    from components.register.component import make_component as register

    prep_op, eval_op, reg_op = data_prep("i/d:t"), evaluate("i/e:t"), register("i/r:t")
    assert set(reg_op.component_spec.outputs) == {
        "decision",
        "registered",
        "promoted",
        "version",
        "decision_text",
        "version_uri",
    }

    @dsl.pipeline(name="prep-evaluate-register")
    def flow(model_uri: str, summary_uri: str, root: str, digest: str) -> str:
        data = prep_op(data_source="bundled", data_sha256="none", shard_size=256, data_limit=400)
        model = dsl.importer(
            artifact_uri=model_uri,
            artifact_class=dsl.Model,
            metadata={"saved_model_sha256": digest},  # as the train component sets it
        )
        run_summary = dsl.importer(artifact_uri=summary_uri, artifact_class=dsl.Artifact)
        scores = eval_op(dataset=data.outputs["dataset"], model=model.output)
        reg = reg_op(
            model=model.output,
            run_summary=run_summary.output,
            dataset=data.outputs["dataset"],
            accuracy=scores.outputs["accuracy"],
            loss=scores.outputs["loss"],
            model_name="mnist-cnn",
            registry_root=root,
            min_accuracy=0.2,
            pipeline_run_id=dsl.PIPELINE_JOB_ID_PLACEHOLDER,
            image_refs='{"register": "i/r:t"}',
        )
        return reg.outputs["decision_text"]

    local.init(runner=local.SubprocessRunner(use_venv=False), pipeline_root=str(tmp_path / "root"))
    root = tmp_path / "registry"
    run = flow(
        model_uri=trained_model.path,
        summary_uri=summary,
        root=str(root),
        digest=trained_model.saved_model_sha256,
    )
    assert (
        run.output == "registered as version 1; promoted to production: no production version yet"
    )
    meta = json.loads((root / "mnist-cnn" / "1" / METADATA_FILE).read_text())
    # Same data (deterministic prep) and model as the fixture: Keras' own accuracy.
    assert meta["metrics"]["accuracy"] == pytest.approx(trained_model.accuracy, abs=1e-6)
    assert meta["image_refs"] == {"register": "i/r:t"} and meta["pipeline_run_id"]
    assert meta["saved_model_sha256"] == trained_model.saved_model_sha256
