"""The compiled pipeline: one YAML, loadable by kfp, images from one place, reproducible."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from kfp import components

from components.common import defaults
from components.train.launcher.parameters import TRAINING_BACKENDS
from pipeline.build import compile_pipeline
from pipeline.checks import (
    PIPELINE_DEFAULTS,
    PIPELINE_PARAMETERS,
    check_parameters_step,
    check_step,
    parameters_markdown,
)

EXPECTED_PARAMETERS = {
    "workers", "epochs", "batch_size_per_worker", "learning_rate", "warmup_epochs", "lr_scaling",
    "threads_per_worker", "model", "augment", "data_source", "data_sha256", "data_limit",
    "shard_size", "min_workers", "data_format", "image_size", "color_mode", "test_fraction",
    "skip_bad_images", "image_feature", "label_feature", "prep_parallelism",
    "mixed_precision",
    "min_accuracy", "model_name", "registry_root", "training_backend", "trainer_image",
    "slots_per_worker", "cpu_per_worker", "memory_per_worker", "gpus_per_worker", "namespace",
    "trainer_service_account", "node_selector", "tolerations",
}  # fmt: skip


def undescribed(parameters: dict[str, dict]) -> dict[str, dict]:
    """The compiled parameters without their descriptions (checked by a test of their own)."""
    return {n: {k: v for k, v in p.items() if k != "description"} for n, p in parameters.items()}


REGISTRY_HELP = (
    "the model store the run registers its model in: a gs:// folder such as "
    "gs://my-bucket/kfp-horovod/models (a local path for a local run)"
)


@pytest.fixture(scope="module")
def compiled(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The pipeline compiled with the default images, alone in its folder."""
    return compile_pipeline(tmp_path_factory.mktemp("compiled") / "pipeline.yaml")


@pytest.fixture(scope="module")
def documents(compiled: Path) -> list[dict]:
    """The YAML's two documents: the pipeline spec, and its Kubernetes platform spec (what the
    pipeline sets on the train task with kfp-kubernetes)."""
    return list(yaml.safe_load_all(compiled.read_text()))


@pytest.fixture(scope="module")
def spec(documents: list[dict]) -> dict:
    return dict(documents[0])


def test_compiles_to_one_yaml_that_kfp_loads_back(compiled: Path, spec: dict) -> None:
    assert [p.name for p in compiled.parent.iterdir()] == ["pipeline.yaml"]  # no temp file left
    loaded = components.load_component_from_file(str(compiled))
    assert loaded.name == "kfp-horovod-mnist"
    assert set(loaded.component_spec.inputs) == EXPECTED_PARAMETERS
    tasks = spec["root"]["dag"]["tasks"]
    assert set(tasks) == {
        "check-parameters",
        "list-data",
        "for-loop-1",
        "publish-dataset",
        "train",
        "evaluate",
        "register-model",
    }
    assert sorted(tasks["train"]["dependentTasks"]) == ["check-parameters", "publish-dataset"]
    assert tasks["list-data"]["dependentTasks"] == ["check-parameters"]
    # data prep: a ParallelFor over the listing's slices, each converting its own, collected
    loop = tasks["for-loop-1"]
    assert (
        loop["parameterIterator"]["items"]["inputParameter"] == "pipelinechannel--list-data-Output"
    )
    assert list(spec["components"][loop["componentRef"]["name"]]["dag"]["tasks"]) == [
        "prepare-slice"
    ]
    parts = tasks["publish-dataset"]["inputs"]["artifacts"]["parts"]["taskOutputArtifact"]
    assert parts == {
        "outputArtifactKey": "pipelinechannel--prepare-slice-part",
        "producerTask": "for-loop-1",
    }
    for step in ("train", "evaluate"):
        dataset = tasks[step]["inputs"]["artifacts"]["dataset"]["taskOutputArtifact"]
        assert dataset == {"outputArtifactKey": "dataset", "producerTask": "publish-dataset"}
    assert tasks["evaluate"]["inputs"]["artifacts"]["saved_model"]["taskOutputArtifact"] == {
        "outputArtifactKey": "saved_model", "producerTask": "train",
    }  # fmt: skip


def test_model_and_augment_reach_the_check_and_the_train_step(spec: dict) -> None:
    """The check step and the train step get both under the same names."""
    parameters = undescribed(spec["root"]["inputDefinitions"]["parameters"])
    assert parameters["model"] == {
        "defaultValue": "mnist_advanced", "isOptional": True, "parameterType": "STRING",
    }  # fmt: skip
    assert parameters["augment"] == {
        "defaultValue": False, "isOptional": True, "parameterType": "BOOLEAN",
    }  # fmt: skip
    for task in ("train", "check-parameters"):
        inputs = spec["root"]["dag"]["tasks"][task]["inputs"]["parameters"]
        assert [inputs[n] for n in ("model", "augment")] == [
            {"componentInputParameter": "model"}, {"componentInputParameter": "augment"},
        ]  # fmt: skip


def test_mixed_precision_reaches_the_train_step_off_by_default(spec: dict) -> None:
    parameters = spec["root"]["inputDefinitions"]["parameters"]
    declared = {k: v for k, v in parameters["mixed_precision"].items() if k != "description"}
    assert declared == {
        "defaultValue": False,
        "isOptional": True,
        "parameterType": "BOOLEAN",
    }
    inputs = spec["root"]["dag"]["tasks"]["train"]["inputs"]["parameters"]
    assert inputs["mixed_precision"] == {"componentInputParameter": "mixed_precision"}


def _check_step_images(spec: dict) -> dict[str, str]:
    images = spec["root"]["dag"]["tasks"]["check-parameters"]["inputs"]["parameters"]["images"]
    return dict(images["runtimeValue"]["constant"])  # a KFP dict parameter, not JSON text


def test_one_image_per_component_tagged_with_the_version(spec: dict) -> None:
    """Every step runs in its own image of this version; the train step in the trainer image the
    check step chooses at run time (the CPU or the GPU one, both compiled in)."""
    expected = {defaults.image_ref(name) for name in defaults.IMAGE_NAMES}
    assert all(image.endswith(f":{defaults.PACKAGE_VERSION}") for image in expected)
    assert _check_step_images(spec) == defaults.image_refs()
    chosen = "{{$.inputs.parameters['pipelinechannel--check-parameters-trainer_image']}}"
    steps = {defaults.image_ref(n) for n in ("data_prep", "evaluate", "register")}
    executors = spec["deploymentSpec"]["executors"].values()
    assert {e["container"]["image"] for e in executors} == steps | {chosen}
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


def test_the_uploaded_pipeline_is_the_cluster_pipeline(spec: dict) -> None:
    """Run from the UI as compiled: the cluster's job operator (``auto``), the image the GPUs
    call for, anywhere; the registry is the one thing a user must fill in."""
    parameters = spec["root"]["inputDefinitions"]["parameters"]
    defaults_back = {name: parameters[name].get("defaultValue") for name in parameters}
    assert defaults_back["training_backend"] == "auto"
    assert (defaults_back["node_selector"], defaults_back["tolerations"]) == ({}, [])
    assert defaults_back["trainer_image"] == ""  # chosen by gpus_per_worker
    assert defaults_back["gpus_per_worker"] == 0
    assert parameters["registry_root"] == {
        "description": REGISTRY_HELP,
        "parameterType": "STRING",
    }  # required: no default, not optional, so the UI asks for it
    assert defaults_back["workers"] == defaults.WORKERS


def test_placement_is_a_dict_and_a_list_set_on_the_train_task_with_kfp_kubernetes(
    documents: list[dict],
) -> None:
    """The only parameters whose type changed (they were JSON text in ``str`` parameters):
    ``node_selector`` a KFP dict, ``tolerations`` a list. The pipeline sets them on the train
    task with kfp-kubernetes, whose task config carries them to the job's pods (the component
    takes neither as an input); the image references are dicts too."""
    spec, platform = documents
    parameters = undescribed(spec["root"]["inputDefinitions"]["parameters"])
    assert parameters["node_selector"] == {
        "defaultValue": {}, "isOptional": True, "parameterType": "STRUCT",
    }  # fmt: skip
    assert parameters["tolerations"] == {
        "defaultValue": [], "isOptional": True, "parameterType": "LIST",
    }  # fmt: skip
    typed = {name for name, p in parameters.items() if p["parameterType"] in ("STRUCT", "LIST")}
    assert typed == {"node_selector", "tolerations"}
    train = platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"]["exec-train"]
    assert train == {
        "nodeSelector": {"nodeSelectorJson": {"componentInputParameter": "node_selector"}},
        "tolerations": [{"tolerationJson": {"componentInputParameter": "tolerations"}}],
    }  # fmt: skip
    inputs = spec["components"]["comp-train"]["inputDefinitions"]["parameters"]
    assert not {"node_selector", "tolerations"} & set(inputs)
    register = spec["root"]["dag"]["tasks"]["register-model"]["inputs"]["parameters"]
    assert register["image_refs"]["runtimeValue"]["constant"] == defaults.image_refs()


def test_images_are_overridable_at_compile_time(tmp_path: Path) -> None:
    spec = next(
        yaml.safe_load_all(
            compile_pipeline(tmp_path / "p.yaml", "europe-docker.pkg.dev/p/r", "abc123").read_text()
        )
    )
    assert _check_step_images(spec) == {
        name: f"europe-docker.pkg.dev/p/r/{image}:abc123"
        for name, image in defaults.IMAGE_NAMES.items()
    }


def test_output_does_not_depend_on_who_compiles_it(compiled: Path, tmp_path: Path) -> None:
    env = {**os.environ, "USER": "someone-else", "HOME": str(tmp_path), "TZ": "Asia/Tokyo"}
    subprocess.run(
        [sys.executable, "-m", "pipeline", "compile", "--output", str(tmp_path / "b.yaml")],
        check=True, env=env, cwd=Path(__file__).resolve().parents[1], capture_output=True,
    )  # fmt: skip
    assert (tmp_path / "b.yaml").read_bytes() == compiled.read_bytes()


def _check(**overrides: object) -> Any:
    values = {**PIPELINE_DEFAULTS, "registry_root": "gs://b/models", **overrides}
    return check_step(images=defaults.image_refs("r.example/p", "7"), **values)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [  # a UI run with an empty registry learns what to fill in; an elastic TrainJob, why not
        ({"registry_root": ""}, "registry_root is empty: set it to the model store the run "
         "registers its model in, a gs:// folder such as gs://my-bucket/kfp-horovod/models"),
        ({"training_backend": "trainjob", "workers": 2, "min_workers": 1},
         "min_workers=1: elastic training needs mpi-operator's"),
    ],
)  # fmt: skip
def test_the_check_step_refuses_naming_the_parameter(overrides: dict, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        _check(**overrides)


GPU_IMAGE = "r.example/p/kfp-horovod-trainer-gpu:7"


@pytest.mark.parametrize(
    ("overrides", "image", "step_gpus"),
    [
        ({}, "r.example/p/kfp-horovod-trainer:7", 0),
        # the MPIJob's workers (the TrainJob's nodes) get the GPUs, not the launching pod
        ({"gpus_per_worker": 2, "slots_per_worker": 2}, GPU_IMAGE, 0),
        ({"gpus_per_worker": 2, "slots_per_worker": 2, "training_backend": "trainjob"},
         GPU_IMAGE, 0),
        # the local backend trains in the step's own pod: one GPU per worker
        ({"gpus_per_worker": 1, "training_backend": "local", "workers": 3}, GPU_IMAGE, 3),
        ({"gpus_per_worker": 1, "trainer_image": "me/my-trainer:1"}, "me/my-trainer:1", 0),
    ],
)  # fmt: skip
def test_the_check_step_chooses_the_trainer_image_from_the_jobs_gpus(
    overrides: dict, image: str, step_gpus: int
) -> None:
    assert tuple(_check(**overrides)) == (image, step_gpus)


def test_the_parameters_page_is_the_declarations() -> None:
    page = Path(__file__).resolve().parents[1] / "docs" / "parameters.md"
    assert page.read_text() == parameters_markdown(), "run: python -m pipeline parameters"


def test_the_train_component_declares_the_task_config_passthroughs(spec: dict) -> None:
    """A pipeline author's resources, env, node selector, tolerations, affinity and volumes on
    the train task reach its ``task_config`` (kfp >= 2.15); resources and env apply to the
    task's own pod too (the local backend trains there), placement and volumes do not."""
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


# --- the pipeline as the Kubeflow UI shows it --------------------------------------------------


def test_every_parameter_carries_its_declared_help_as_its_description(spec: dict) -> None:
    """The UI shows each parameter's description: its declaration's help, as the CLIs do."""
    parameters = spec["root"]["inputDefinitions"]["parameters"]
    declared = {p.name: p for p in PIPELINE_PARAMETERS}
    assert set(parameters) == set(declared)
    for name, compiled_parameter in parameters.items():
        assert compiled_parameter.get("description"), f"{name} has no description"
        assert compiled_parameter["description"] == " ".join(declared[name].help.split()), name


def test_the_pipeline_description_names_each_training_backend_and_what_runs(spec: dict) -> None:
    description = spec["pipelineInfo"]["description"]
    assert all(backend in description for backend in TRAINING_BACKENDS), description
    assert all(word in description for word in ("MPIJob", "TrainJob", "mpirun")), description


def _typed(parameter: dict) -> Any:
    """A compiled default as KFP's executor hands it to a step (integers compile as floats)."""
    value = parameter["defaultValue"]
    return int(value) if parameter["parameterType"] == "NUMBER_INTEGER" else value


def test_pressing_run_with_only_the_required_parameters_passes_the_check_step(
    spec: dict, gcs_uri: str
) -> None:
    """The README's "upload and press Run": the parameters the UI marks required (no
    ``isOptional``) are the ones the README tells the user to fill in, and with those filled in
    and every other one at its compiled default the check step passes, storage included
    (fake-gcs-server for the bucket)."""
    parameters = spec["root"]["inputDefinitions"]["parameters"]
    required = {name for name, p in parameters.items() if not p.get("isOptional")}
    assert required == {p.name for p in PIPELINE_PARAMETERS if p.required}
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    (press_run,) = [part for part in readme.split("\n\n") if "press Run" in part]
    assert all(f"`{name}`" in press_run for name in required), press_run
    filled_in = {"registry_root": f"{gcs_uri}/models"}  # what a user types into the UI
    assert required <= set(filled_in), f"a value to fill in for {required - set(filled_in)}"
    values = {name: _typed(p) for name, p in parameters.items() if p.get("isOptional")}
    values |= {name: filled_in[name] for name in required}
    images = _check_step_images(spec)
    assert check_parameters_step(images, **values).trainer_image == images["trainer"]
    with pytest.raises(ValueError, match="registry_root is empty"):  # what an empty field gets
        check_parameters_step(images, **values | {"registry_root": ""})


def test_the_parameters_users_set_are_those_before_round_4(spec: dict) -> None:
    """The compiled pipeline's parameters are the users' API: each one's name, type, default and
    whether it may be left out are those compiled from 4d7f064, before the redesign of issue 48
    (tests/data holds them, without their descriptions, whose words may be improved)."""
    before = json.loads(
        (Path(__file__).parent / "data/pipeline_parameters_before_round4.json").read_text()
    )
    now = spec["root"]["inputDefinitions"]["parameters"]
    assert undescribed(now) == before
