"""The ``node_selector`` and ``tolerations`` parameters' rules: every bad value is refused in one
line naming the offending key or field, by the declared rule the check step, the CLIs and the
train step share."""

from __future__ import annotations

import json

import pytest

from components.common.placement import (
    merge_tolerations,
    node_selector_problem,
    tolerations_problem,
)
from components.train.step import TrainStep
from pipeline.checks import PIPELINE_PARAMETERS, check_step

GOOD_SELECTORS = [
    "{}", "",
    '{"cloud.google.com/gke-accelerator": "nvidia-l4"}',
    '{"cloud.google.com/gke-spot": "true", "pool": ""}',
    json.dumps({"a" * 63: "b" * 63, "x.y/" + "z" * 63: "v"}),
]  # fmt: skip
BAD_SELECTORS = [
    ('["a"]', "node_selector must be a JSON object of label -> value, got '[\"a\"]'"),
    ("{pool: gpu}", "node_selector is not JSON (Expecting property name enclosed in double"),
    ('{"bad key": "x"}', "node_selector: label key 'bad key': its name must be <= 63"),
    ('{"-pool": "x"}', "node_selector: label key '-pool': its name must be"),
    ('{"Example.com/pool": "x"}', "node_selector: label key 'Example.com/pool': its prefix"),
    (json.dumps({"p" * 64: "x"}), f"node_selector: label key '{'p' * 64}': its name must be"),
    ('{"/pool": "x"}', "node_selector: label key '/pool': its prefix must be"),
    ('{"pool": "a b"}', "node_selector: label 'pool': value 'a b' is not a label value"),
    ('{"pool": 3}', "node_selector: label 'pool': value 3 is not a label value"),
    (json.dumps({"pool": "v" * 64}), "node_selector: label 'pool': value 'vvvv"),
]
GPU = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
GOOD_TOLERATIONS = [
    "[]", "",
    json.dumps([GPU]),
    '[{"key": "team", "operator": "Equal", "value": "ml", "effect": "NoSchedule"}]',
    '[{"key": "cloud.google.com/gke-spot", "value": "true", "effect": "NoExecute", '
    '"tolerationSeconds": 30}]',
    '[{"operator": "Exists"}]',
    '[{"key": "x", "effect": ""}]',
]  # fmt: skip
BAD_TOLERATIONS = [
    ('{"key": "a"}', "tolerations must be a JSON list of tolerations, got"),
    ("[{key}]", "tolerations is not JSON"),
    ('["team"]', "tolerations[0]: 'team' is not an object"),
    ('[{"key": "a", "efect": "NoSchedule"}]', "tolerations[0]: unknown field 'efect' (known: key,"),
    (
        '[{"operator": "Exists"}, {"key": "a", "operator": "In"}]',
        "tolerations[1]: operator 'In' is not one of Exists",
    ),
    ('[{"key": "a", "effect": "Never"}]', "tolerations[0]: effect 'Never' is not one of"),
    ('[{"key": "a b", "operator": "Exists"}]', "tolerations[0]: key: label key 'a b'"),
    ('[{"value": "x"}]', "tolerations[0]: an empty key needs operator 'Exists'"),
    ('[{"key": "a", "operator": "Exists", "value": "x"}]', "takes no value, got 'x'"),
    ('[{"key": "a", "tolerationSeconds": "30"}]', "tolerationSeconds must be an integer"),
    ('[{"key": "a", "tolerationSeconds": true}]', "tolerationSeconds must be an integer"),
]


@pytest.mark.parametrize("text", GOOD_SELECTORS)
def test_a_node_selector_of_valid_labels_is_accepted(text: str) -> None:
    assert node_selector_problem(text) is None


@pytest.mark.parametrize(("text", "expected"), BAD_SELECTORS)
def test_a_bad_node_selector_is_refused_naming_the_key(text: str, expected: str) -> None:
    problem = node_selector_problem(text)
    assert problem is not None and problem.startswith(expected), problem
    assert "\n" not in problem


@pytest.mark.parametrize("text", GOOD_TOLERATIONS)
def test_valid_tolerations_are_accepted(text: str) -> None:
    assert tolerations_problem(text) is None


@pytest.mark.parametrize(("text", "expected"), BAD_TOLERATIONS)
def test_a_bad_toleration_is_refused_naming_the_field(text: str, expected: str) -> None:
    problem = tolerations_problem(text)
    assert problem is not None and expected in problem, problem
    assert "\n" not in problem


def _check(**overrides: object) -> object:
    values = {p.name: p.default for p in PIPELINE_PARAMETERS}
    values.update({"registry_root": "gs://b/models", **overrides})
    return check_step(images=json.dumps({"trainer": "t", "trainer_gpu": "g"}), **values)


def test_the_check_step_refuses_bad_placement_in_one_line_before_anything_runs() -> None:
    with pytest.raises(ValueError) as info:
        _check(node_selector='{"bad key": "x"}', tolerations='[{"key": "a", "operator": "In"}]')
    message = str(info.value)
    assert message.startswith("invalid pipeline parameters: node_selector: label key 'bad key'")
    assert "; tolerations[0]: operator 'In' is not one of Exists, Equal" in message
    assert "\n" not in message
    _check(node_selector=GOOD_SELECTORS[2], tolerations=GOOD_TOLERATIONS[3])  # accepted


def test_the_train_step_refuses_what_the_check_step_refuses() -> None:
    with pytest.raises(ValueError, match="node_selector: label key 'bad key'"):
        TrainStep(node_selector='{"bad key": "x"}')


def test_tolerations_merge_without_repeating_one() -> None:
    team = {"key": "team", "value": "ml", "effect": "NoSchedule"}  # operator Equal, unset
    same_team = {"key": "team", "operator": "Equal", "value": "ml", "effect": "NoSchedule"}
    assert merge_tolerations([GPU, team], [same_team, dict(GPU)], [GPU]) == [GPU, team]
    other = {**team, "effect": "NoExecute"}
    assert merge_tolerations([team], [other]) == [team, other]
