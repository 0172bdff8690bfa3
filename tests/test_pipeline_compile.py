"""The compiled pipeline: one YAML, loadable by kfp, images from one place, reproducible."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import yaml
from kfp import components

from components.common import defaults
from pipeline.build import compile_pipeline

EXPECTED_PARAMETERS = {
    "workers", "epochs", "batch_size_per_worker", "learning_rate", "warmup_epochs", "lr_scaling",
    "threads_per_worker", "model", "augment", "data_source", "data_sha256", "data_limit",
    "shard_size", "min_workers",
    "min_accuracy", "model_name", "registry_root", "training_backend", "trainer_image",
    "slots_per_worker", "cpu_per_worker", "memory_per_worker", "gpus_per_worker", "namespace",
    "trainer_service_account", "node_selector", "tolerations",
}  # fmt: skip


def _images(spec: dict) -> set[str]:
    """The images of the compiled executors."""
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
    assert sorted(tasks["train"]["dependentTasks"]) == ["check-parameters", "prepare-data"]
    assert tasks["evaluate"]["inputs"]["artifacts"]["model"]["taskOutputArtifact"] == {
        "outputArtifactKey": "saved_model", "producerTask": "train",
    }  # fmt: skip


def test_model_and_augment_reach_the_check_and_the_train_step(tmp_path: Path) -> None:
    """The compiled defaults are mnist_advanced, no augmentation; the check step sees both
    parameters and the train step gets them under the same names."""
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
    assert train["model"] == {"componentInputParameter": "model"}
    assert train["augment"] == {"componentInputParameter": "augment"}
    check = tasks["check-parameters"]["inputs"]["parameters"]
    assert check["model"] == {"componentInputParameter": "model"}
    assert check["augment"] == {"componentInputParameter": "augment"}


def _check_step_images(spec: dict) -> dict[str, str]:
    """The image references compiled into the check step's ``images`` input."""
    images = spec["root"]["dag"]["tasks"]["check-parameters"]["inputs"]["parameters"]["images"]
    return dict(json.loads(images["runtimeValue"]["constant"]))


def test_one_image_per_component_tagged_with_the_version(tmp_path: Path) -> None:
    """Every step runs in its own image of this version; the train step in the trainer image the
    check step chooses at run time (the CPU or the GPU one, both compiled in)."""
    spec = yaml.safe_load(compile_pipeline(tmp_path / "p.yaml").read_text())
    expected = {defaults.image_ref(name) for name in defaults.IMAGE_NAMES}
    assert all(image.endswith(f":{defaults.PACKAGE_VERSION}") for image in expected)
    assert _check_step_images(spec) == defaults.image_refs()
    chosen = "{{$.inputs.parameters['pipelinechannel--check-parameters-trainer_image']}}"
    steps = {defaults.image_ref(n) for n in ("data_prep", "evaluate", "register")}
    assert _images(spec) == steps | {chosen}
    train = spec["root"]["dag"]["tasks"]["train"]["inputs"]["parameters"]
    assert train["trainer_image"] == {
        "taskOutputParameter": {"outputParameterKey": "trainer_image",
                                "producerTask": "check-parameters"},
    }  # fmt: skip
    executor = spec["deploymentSpec"]["executors"]["exec-train"]["container"]
    assert executor["resources"]["accelerator"] == {
        "resourceCount": "{{$.inputs.parameters['pipelinechannel--check-parameters-"
        "train_step_gpus']}}",
        "resourceType": "nvidia.com/gpu", "type": "nvidia.com/gpu",
    }  # fmt: skip


def test_the_uploaded_pipeline_is_the_cluster_pipeline(tmp_path: Path) -> None:
    """Uploaded and run from the UI as compiled, the pipeline trains on the job operator the
    cluster serves (``auto``), in the image the job's GPUs call for, anywhere the cluster
    places it; the registry is the one thing a user must fill in."""
    spec = yaml.safe_load(compile_pipeline(tmp_path / "p.yaml").read_text())
    parameters = spec["root"]["inputDefinitions"]["parameters"]
    defaults_back = {name: parameters[name].get("defaultValue") for name in parameters}
    assert defaults_back["training_backend"] == "auto"
    assert (defaults_back["node_selector"], defaults_back["tolerations"]) == ("{}", "[]")
    assert defaults_back["trainer_image"] == ""  # chosen by gpus_per_worker
    assert defaults_back["gpus_per_worker"] == 0
    assert defaults_back["registry_root"] == ""
    assert defaults_back["workers"] == defaults.WORKERS


def test_images_are_overridable_at_compile_time(tmp_path: Path) -> None:
    spec = yaml.safe_load(
        compile_pipeline(tmp_path / "p.yaml", "europe-docker.pkg.dev/p/r", "abc123").read_text()
    )
    assert _check_step_images(spec) == {
        name: f"europe-docker.pkg.dev/p/r/{image}:abc123"
        for name, image in defaults.IMAGE_NAMES.items()
    }


def test_output_does_not_depend_on_who_compiles_it(tmp_path: Path) -> None:
    here = compile_pipeline(tmp_path / "a.yaml").read_bytes()
    env = {**os.environ, "USER": "someone-else", "HOME": str(tmp_path), "TZ": "Asia/Tokyo"}
    subprocess.run(
        [sys.executable, "-m", "pipeline", "compile", "--output", str(tmp_path / "b.yaml")],
        check=True, env=env, cwd=Path(__file__).resolve().parents[1], capture_output=True,
    )  # fmt: skip
    assert (tmp_path / "b.yaml").read_bytes() == here


def _check(**overrides: object) -> object:
    """The check step's program, called as the step calls it, with the compiled defaults."""
    from pipeline.checks import PIPELINE_PARAMETERS, check_step

    values = {p.name: p.default for p in PIPELINE_PARAMETERS}
    values.update({"registry_root": "gs://b/models", **overrides})
    return check_step(images=json.dumps(defaults.image_refs("r.example/p", "7")), **values)


def test_a_ui_run_with_an_empty_registry_fails_in_the_check_step_saying_what_to_fill_in() -> None:
    import pytest

    with pytest.raises(ValueError) as info:
        _check(registry_root="")
    assert "registry_root is empty: set it to the model store" in str(info.value)
    assert "such as gs://my-bucket/kfp-horovod/models" in str(info.value)


def test_the_check_step_chooses_the_trainer_image_from_the_jobs_gpus() -> None:
    cpu = _check()
    assert (cpu.trainer_image, cpu.train_step_gpus) == ("r.example/p/kfp-horovod-trainer:7", 0)
    gpu = _check(gpus_per_worker=2, slots_per_worker=2)
    assert gpu.trainer_image == "r.example/p/kfp-horovod-trainer-gpu:7"
    assert gpu.train_step_gpus == 0  # the MPIJob's workers get the GPUs, not the launching pod
    local = _check(gpus_per_worker=1, training_backend="local", workers=3)
    assert (local.trainer_image, local.train_step_gpus) == (
        "r.example/p/kfp-horovod-trainer-gpu:7", 3,
    )  # fmt: skip  # the local backend trains in the step's own pod: one GPU per worker
    mine = _check(gpus_per_worker=1, trainer_image="me/my-trainer:1")
    assert mine.trainer_image == "me/my-trainer:1"  # a user-given image wins
    trainjob = _check(gpus_per_worker=2, slots_per_worker=2, training_backend="trainjob")
    assert (trainjob.trainer_image, trainjob.train_step_gpus) == (
        "r.example/p/kfp-horovod-trainer-gpu:7", 0,
    )  # fmt: skip  # the TrainJob's nodes get the GPUs, not the launching pod


def test_the_check_step_refuses_an_elastic_trainjob_by_name() -> None:
    import pytest

    with pytest.raises(ValueError, match="min_workers=1: elastic training needs mpi-operator's"):
        _check(training_backend="trainjob", workers=2, min_workers=1)


def test_the_parameters_page_is_the_declarations() -> None:
    from pipeline.checks import parameters_markdown

    page = Path(__file__).resolve().parents[1] / "docs" / "parameters.md"
    assert page.read_text() == parameters_markdown(), "run: python -m pipeline parameters"


def test_the_train_component_declares_the_task_config_passthroughs(tmp_path: Path) -> None:
    """A pipeline author's resources, env, node selector, tolerations, affinity and volumes on
    the train task reach its ``task_config`` (kfp >= 2.15); resources and env apply to the
    task's own pod too (the local backend trains there), placement and volumes do not."""
    spec = yaml.safe_load(compile_pipeline(tmp_path / "p.yaml").read_text())
    train = spec["components"]["comp-train"]
    assert train["inputDefinitions"]["parameters"]["task_config"] == {
        "isOptional": True, "parameterType": "TASK_CONFIG",
    }  # fmt: skip
    assert {p["field"]: p.get("applyToTask", False) for p in train["taskConfigPassthroughs"]} == {
        "RESOURCES": True, "ENV": True, "KUBERNETES_NODE_SELECTOR": False,
        "KUBERNETES_TOLERATIONS": False, "KUBERNETES_AFFINITY": False,
        "KUBERNETES_VOLUMES": False,
    }  # fmt: skip
    assert "task_config" not in spec["root"]["dag"]["tasks"]["train"]["inputs"]["parameters"]
