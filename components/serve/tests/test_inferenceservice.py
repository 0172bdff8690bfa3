"""``python -m pipeline render-inferenceservice``: the InferenceService of a registry's alias
(read from gs:// on fake-gcs-server), valid against KServe's vendored CRD; bad input refused."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from components.common.crd import ManifestError, find_crd, manifest_problems
from components.common.failure import ExitCode
from components.register.registry import ModelStore, challenger_wins
from components.serve.inferenceservice import (
    INFERENCESERVICE,
    build_inferenceservice,
    validate_inferenceservice,
)
from pipeline.cli import cli


@pytest.fixture
def registry(gcs_uri: str) -> str:
    """A gs:// registry whose production alias names version 4 (the folder not synced)."""
    root = f"{gcs_uri}/models"
    record = {"version": 4, "metrics": {"accuracy": 0.98, "loss": 0.1}}
    assert ModelStore(root, "mnist-cnn").move_alias_if("production", record, challenger_wins)[0]
    return root


def render(*args: str) -> Any:
    return CliRunner().invoke(cli, ["render-inferenceservice", *args])


def test_renders_a_crd_valid_inferenceservice_of_the_serving_folder(registry: str) -> None:
    tolerations = [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}]
    result = render(
        "--registry-root",
        registry,
        "--namespace",
        "kubeflow",
        "--gpus",
        "1",
        "--cpu",
        "2",
        "--memory",
        "4Gi",
        "--node-selector",
        '{"pool": "serving"}',
        "--tolerations",
        json.dumps(tolerations),
        "--runtime-version",
        "2.19.1-gpu",
    )
    assert result.exit_code == 0, result.output
    folder = f"{registry}/mnist-cnn/_serving/production"
    assert result.stderr.startswith(f"note: {folder} does not hold version 4 alone yet")
    manifest = yaml.safe_load(result.stdout)
    assert manifest == {
        "apiVersion": "serving.kserve.io/v1beta1",
        "kind": "InferenceService",
        "metadata": {
            "name": "mnist-cnn",
            "labels": {"app.kubernetes.io/name": "kfp-horovod"},
            "namespace": "kubeflow",
        },
        "spec": {
            "predictor": {
                "serviceAccountName": "kfp-horovod-trainer",
                "model": {
                    "modelFormat": {"name": "tensorflow"},
                    "storageUri": folder,
                    "resources": {
                        "requests": {"cpu": "2", "memory": "4Gi"},
                        "limits": {"cpu": "2", "memory": "4Gi", "nvidia.com/gpu": 1},
                    },
                    "runtimeVersion": "2.19.1-gpu",
                    "args": [f"--model_base_path={folder}", "--file_system_poll_wait_seconds=30"],
                },
                "nodeSelector": {"pool": "serving"},
                "tolerations": tolerations,
            }
        },
    }
    assert manifest_problems(manifest, INFERENCESERVICE) == []


def test_defaults_and_no_polling(registry: str) -> None:
    result = render("--registry-root", registry, "--poll-seconds", "0", "--name", "digits")
    assert result.exit_code == 0, result.output
    manifest = yaml.safe_load(result.stdout)
    predictor = manifest["spec"]["predictor"]
    assert manifest["metadata"]["name"] == "digits" and "namespace" not in manifest["metadata"]
    assert "args" not in predictor["model"] and "nodeSelector" not in predictor
    assert predictor["model"]["resources"]["limits"] == {"cpu": "1", "memory": "2Gi"}


def test_the_crd_check_is_strict() -> None:
    """The vendored CRD is KServe's, and a field it does not declare is an error."""
    assert find_crd(INFERENCESERVICE).name == "serving.kserve.io_inferenceservices.yaml"
    manifest = build_inferenceservice("mnist-cnn", "gs://b/m/_serving/production")
    validate_inferenceservice(manifest)
    manifest["spec"]["predictor"]["model"]["storageURI"] = "gs://typo"
    manifest["spec"]["predictor"]["minReplicas"] = "one"
    with pytest.raises(ManifestError) as info:
        validate_inferenceservice(manifest)
    assert "spec.predictor.minReplicas: 'one' is not of type 'integer'" in str(info.value)
    assert "'storageURI' was unexpected" in str(info.value)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--alias", "staging"], "alias 'staging' does not exist for model 'mnist-cnn' in "),
        (["--model-name", "other"], "alias 'production' does not exist for model 'other'"),
        # the training job's placement rules (components.common.placement), the same lines
        (["--node-selector", "[1]"], "node_selector must be a JSON object of label -> value"),
        (["--node-selector", "{x"], "node_selector is not JSON"),
        (["--node-selector", '{"Bad Key": "x"}'], "node_selector: label key 'Bad Key'"),
        (["--tolerations", '{"key": "a"}'], "tolerations must be a JSON list of tolerations"),
        (["--tolerations", '[{"keys": "a"}]'], "tolerations[0]: unknown field 'keys'"),
        (["--gpus", "-1"], "--gpus and --poll-seconds must be >= 0"),
        (["--name", "Bad_Name"], "name 'Bad_Name' is not a valid InferenceService name"),
        (["--alias", "prod/x"], "alias 'prod/x' is not allowed"),
        (["--registry-root", "/tmp/local"], "the serving folder must be a gs:// URI on a cluster"),
    ],
)
def test_bad_input_is_refused_in_one_line(registry: str, args: list[str], message: str) -> None:
    result = render("--registry-root", registry, *args)
    assert (result.exit_code, result.stdout) == (ExitCode.BAD_INPUT, "")
    (line,) = result.stderr.splitlines()
    assert line.startswith("FAILED: ") and message in line, line


@pytest.mark.parametrize(
    "text", ["- a list\n- of items\n", "just: [unclosed\n", "plain text, no YAML mapping\n"]
)
def test_a_crd_file_that_is_not_the_crd_is_refused_in_one_line(
    registry: str, tmp_path: Path, text: str
) -> None:
    """``--crd`` on a file that is not KServe's CRD: one line naming it, no traceback."""
    crd = tmp_path / "not-a-crd.yaml"
    crd.write_text(text)
    result = render("--registry-root", registry, "--crd", str(crd))
    assert (result.exit_code, result.stdout) == (ExitCode.BAD_INPUT, ""), result.output
    (line,) = result.stderr.splitlines()
    assert line.startswith(f"FAILED: {crd} is not the serving.kserve.io InferenceService CRD")
