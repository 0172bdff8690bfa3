"""The signatures written in the source agree with the declarations: each KFP component's
function, the pipeline's, the check step's and the command lines take each declared parameter
under its name, with its type (and, for the pipeline and the command lines, its default), in the
declared order, and nothing else but the artifacts and values each one lists here. A parameter is
declared once (`components.common.declare.param`); what a reader finds in a ``def`` is held to it
here, so nothing needs generating."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from typing import Any

import click
import pytest

from components.common.declare import Declared
from components.data_prep import component as data_prep
from components.data_prep.prep import command as prep_command
from components.data_prep.step_parameters import (
    LIST_PARAMETERS,
    PUBLISH_PARAMETERS,
    SLICE_PARAMETERS,
    PrepStep,
)
from components.evaluate.component import evaluate
from components.register.component import register_model
from components.register.register import command as register_command
from components.register.step_parameters import RegisterStep
from components.train.config import TrainConfig, trainer_command
from components.train.launcher.parameters import TrainStep
from components.train.step.component import train
from pipeline.build import image_refs
from pipeline.check_component import check_parameters
from pipeline.checks import PIPELINE_DEFAULTS, PIPELINE_PARAMETERS
from pipeline.pipeline import build_pipeline, build_prep_pipeline

TRAIN_DECLARED = [
    *TrainConfig.parameters(pipeline_only=True),
    *TrainStep.parameters(pipeline_only=True),
]
# component function -> (its declared parameters, the names it takes besides, in its order)
COMPONENTS: dict[Callable[..., Any], tuple[list[Declared], list[str]]] = {
    train: (
        TRAIN_DECLARED,
        [
            "dataset",
            *(p.name for p in TRAIN_DECLARED),
            "pipeline_run_id",
            "task_config",
            "saved_model",
            "run_summary",
            "coordination_report",
        ],
    ),
    data_prep.list_data: (LIST_PARAMETERS, [*(p.name for p in LIST_PARAMETERS), "listing"]),
    data_prep.prepare_slice: (
        SLICE_PARAMETERS,
        ["listing", "slice_index", *(p.name for p in SLICE_PARAMETERS), "shards", "part"],
    ),
    data_prep.publish_dataset: (
        PUBLISH_PARAMETERS,
        ["listing", "parts", *(p.name for p in PUBLISH_PARAMETERS), "dataset"],
    ),
    evaluate: ([], ["dataset", "saved_model", "metrics", "confusion_matrix", "report"]),
    register_model: (
        RegisterStep.parameters(),
        [
            "saved_model",
            "run_summary",
            "dataset",
            "accuracy",
            "loss",
            "confusion_matrix",
            *(p.name for p in RegisterStep.parameters()),
            "pipeline_run_id",
            "image_refs",
            "decision",
        ],
    ),
    check_parameters: (PIPELINE_PARAMETERS, [*(p.name for p in PIPELINE_PARAMETERS), "images"]),
}


@pytest.mark.parametrize("function", COMPONENTS, ids=lambda f: f.__name__)
def test_each_component_takes_its_declared_parameters_by_name_and_type(
    function: Callable[..., Any],
) -> None:
    declared, names = COMPONENTS[function]
    parameters = inspect.signature(function).parameters
    assert list(parameters) == names
    for p in declared:
        assert parameters[p.name].annotation is p.type, p.name
        assert parameters[p.name].default is inspect.Parameter.empty, p.name  # the pipeline's


def test_every_data_prep_parameter_reaches_a_data_prep_component() -> None:
    taken = {
        p.name for group in (LIST_PARAMETERS, SLICE_PARAMETERS, PUBLISH_PARAMETERS) for p in group
    }
    assert taken == {p.name for p in PrepStep.parameters()}


def test_the_pipeline_takes_every_declared_parameter_with_its_type_and_default() -> None:
    """Required parameters first (Python's rule), then the rest in the declared order."""
    function = build_pipeline(image_refs(None, None)).pipeline_func
    parameters = inspect.signature(function).parameters
    ordered = sorted(PIPELINE_PARAMETERS, key=lambda p: not p.required)
    assert list(parameters) == [p.name for p in ordered]
    for p in PIPELINE_PARAMETERS:
        assert parameters[p.name].annotation is p.type, p.name
        want = inspect.Parameter.empty if p.required else PIPELINE_DEFAULTS[p.name]
        assert parameters[p.name].default == want, p.name


def _options(command: click.Command) -> dict[str, click.Option]:
    return {o.name: o for o in command.params if isinstance(o, click.Option) and o.name}


@pytest.mark.parametrize(
    ("command", "declared"),
    [
        (trainer_command, TrainConfig.parameters()),
        (prep_command, PrepStep.parameters()),
        (register_command, RegisterStep.parameters()),
    ],
    ids=["trainer", "data prep", "register"],
)
def test_each_command_line_has_an_option_per_declared_parameter(
    command: click.Command, declared: Sequence[Declared]
) -> None:
    """Its flag, its type, its default, whether it is required, and its help."""
    options = _options(command)
    for p in declared:
        option = options[p.name]
        flags = [*option.opts, *option.secondary_opts]
        assert flags == ([p.flag, "--no-" + p.flag[2:]] if p.type is bool else [p.flag]), p.name
        assert option.required == p.required, p.name
        if not p.required:
            assert option.default == p.default, p.name
        assert option.help == p.help, p.name
        if p.type in (int, float, str) and not p.rule.choices:
            assert option.type.name == click.types.convert_type(p.type).name, p.name


def test_the_data_prep_pipeline_takes_data_preps_declared_parameters() -> None:
    function = build_prep_pipeline("data-prep:test").pipeline_func
    parameters = inspect.signature(function).parameters
    assert list(parameters) == [p.name for p in PrepStep.parameters()]
    for p in PrepStep.parameters():
        assert (parameters[p.name].annotation, parameters[p.name].default) == (p.type, p.default)
