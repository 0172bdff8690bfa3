"""The compiled pipeline: one YAML, loadable by kfp, images from one place, reproducible."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import yaml
from kfp import components

from components.common import defaults
from pipeline.build import compile_pipeline

EXPECTED_PARAMETERS = {
    "workers", "epochs", "batch_size_per_worker", "learning_rate", "warmup_epochs",
    "threads_per_worker", "model", "augment", "data_source", "data_sha256", "data_limit",
    "shard_size", "min_workers",
    "min_accuracy", "model_name", "registry_root", "training_backend", "trainer_image",
    "slots_per_worker", "cpu_per_worker", "memory_per_worker", "gpus_per_worker", "namespace",
    "trainer_service_account",
}  # fmt: skip


def _images(spec: dict) -> set[str]:
    return {e["container"]["image"] for e in spec["deploymentSpec"]["executors"].values()}


def test_compiles_to_one_yaml_that_kfp_loads_back(tmp_path: Path) -> None:
    path = compile_pipeline(tmp_path / "pipeline.yaml")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pipeline.yaml"]  # no temp file left
    loaded = components.load_component_from_file(str(path))
    assert loaded.name == "kfp-horovod-mnist"
    assert set(loaded.component_spec.inputs) == EXPECTED_PARAMETERS
    spec = yaml.safe_load(path.read_text())
    tasks = spec["root"]["dag"]["tasks"]
    assert set(tasks) == {"check-parameters", "prepare-data", "train", "evaluate", "register-model"}
    assert tasks["train"]["dependentTasks"] == ["prepare-data"]
    assert tasks["evaluate"]["inputs"]["artifacts"]["model"]["taskOutputArtifact"] == {
        "outputArtifactKey": "model", "producerTask": "train",
    }  # fmt: skip


def test_model_and_augment_reach_the_check_and_the_train_step(tmp_path: Path) -> None:
    """The compiled defaults are mnist_advanced, no augmentation; the check step sees both
    parameters and the train step gets them (``model`` as its input ``architecture``)."""
    spec = yaml.safe_load(compile_pipeline(tmp_path / "p.yaml").read_text())
    parameters = spec["root"]["inputDefinitions"]["parameters"]
    assert parameters["model"] == {
        "defaultValue": "mnist_advanced", "isOptional": True, "parameterType": "STRING",
    }  # fmt: skip
    assert parameters["augment"] == {
        "defaultValue": False, "isOptional": True, "parameterType": "BOOLEAN",
    }  # fmt: skip
    tasks = spec["root"]["dag"]["tasks"]
    train = tasks["train"]["inputs"]["parameters"]
    assert train["architecture"] == {"componentInputParameter": "model"}
    assert train["augment"] == {"componentInputParameter": "augment"}
    check = tasks["check-parameters"]["inputs"]["parameters"]
    assert check["model"] == {"componentInputParameter": "model"}
    assert check["augment"] == {"componentInputParameter": "augment"}


def test_one_image_per_component_tagged_with_the_version(tmp_path: Path) -> None:
    spec = yaml.safe_load(compile_pipeline(tmp_path / "p.yaml").read_text())
    expected = {defaults.image_ref(name) for name in defaults.STEP_IMAGES}
    assert _images(spec) == expected
    assert all(image.endswith(f":{defaults.PACKAGE_VERSION}") for image in expected)
    default_trainer = spec["root"]["inputDefinitions"]["parameters"]["trainer_image"][
        "defaultValue"
    ]
    assert default_trainer == defaults.image_ref("trainer")


def test_images_are_overridable_at_compile_time(tmp_path: Path) -> None:
    spec = yaml.safe_load(
        compile_pipeline(tmp_path / "p.yaml", "europe-docker.pkg.dev/p/r", "abc123").read_text()
    )
    assert _images(spec) == {
        f"europe-docker.pkg.dev/p/r/{defaults.IMAGE_NAMES[name]}:abc123"
        for name in defaults.STEP_IMAGES
    }


def test_output_does_not_depend_on_who_compiles_it(tmp_path: Path) -> None:
    here = compile_pipeline(tmp_path / "a.yaml").read_bytes()
    env = {**os.environ, "USER": "someone-else", "HOME": str(tmp_path), "TZ": "Asia/Tokyo"}
    subprocess.run(
        [sys.executable, "-m", "pipeline", "compile", "--output", str(tmp_path / "b.yaml")],
        check=True, env=env, cwd=Path(__file__).resolve().parents[1], capture_output=True,
    )  # fmt: skip
    assert (tmp_path / "b.yaml").read_bytes() == here
