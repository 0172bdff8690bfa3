"""The ``node_selector`` and ``tolerations`` parameters' rules: every bad value is refused in one
line naming the offending key or field, by the declared rule (`Placement`) the check step, the
CLIs (JSON text on their command lines) and the train step's task config share."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest

from components.common.declare import json_value
from components.common.failure import InputError
from components.common.placement import (
    Placement,
    merge_tolerations,
    node_selector_problem,
    tolerations_problem,
)
from pipeline.checks import PIPELINE_PARAMETERS, check_step

GOOD_SELECTORS = [
    "{}",
    "",
    '{"cloud.google.com/gke-accelerator": "nvidia-l4"}',
    '{"cloud.google.com/gke-spot": "true", "pool": ""}',
    json.dumps({"a" * 63: "b" * 63, "x.y/" + "z" * 63: "v"}),
]
BAD_SELECTORS = [
    ('["a"]', "node_selector must be a JSON object of label -> value, got ['a']"),
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
    "[]",
    "",
    json.dumps([GPU]),
    '[{"key": "team", "operator": "Equal", "value": "ml", "effect": "NoSchedule"}]',
    '[{"key": "cloud.google.com/gke-spot", "value": "true", "effect": "NoExecute", '
    '"tolerationSeconds": 30}]',
    '[{"operator": "Exists"}]',
    '[{"key": "x", "effect": ""}]',
]
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


def _problem(rule: Callable[[object], str | None], name: str, text: str, empty: object) -> object:
    """What `rule` says of JSON `text`, read as the CLIs read it (text that is not JSON: why)."""
    try:
        return rule(json_value(name, text, empty))
    except InputError as exc:
        return str(exc)


@pytest.mark.parametrize("text", GOOD_SELECTORS)
def test_a_node_selector_of_valid_labels_is_accepted(text: str) -> None:
    assert _problem(node_selector_problem, "node_selector", text, {}) is None


@pytest.mark.parametrize(("text", "expected"), BAD_SELECTORS)
def test_a_bad_node_selector_is_refused_naming_the_key(text: str, expected: str) -> None:
    problem = _problem(node_selector_problem, "node_selector", text, {})
    assert isinstance(problem, str) and problem.startswith(expected), problem
    assert "\n" not in problem


@pytest.mark.parametrize("text", GOOD_TOLERATIONS)
def test_valid_tolerations_are_accepted(text: str) -> None:
    assert _problem(tolerations_problem, "tolerations", text, []) is None


@pytest.mark.parametrize(("text", "expected"), BAD_TOLERATIONS)
def test_a_bad_toleration_is_refused_naming_the_field(text: str, expected: str) -> None:
    problem = _problem(tolerations_problem, "tolerations", text, [])
    assert isinstance(problem, str) and expected in problem, problem
    assert "\n" not in problem


def _check(**overrides: object) -> object:
    values = {p.name: p.default for p in PIPELINE_PARAMETERS}
    values.update({"registry_root": "gs://b/models", **overrides})
    return check_step(images={"trainer": "t", "trainer_gpu": "g"}, **values)


def test_the_check_step_refuses_bad_placement_in_one_line_before_anything_runs() -> None:
    """KFP hands the check step the run's ``dict`` and ``list`` values."""
    with pytest.raises(ValueError) as info:
        _check(node_selector={"bad key": "x"}, tolerations=[{"key": "a", "operator": "In"}])
    message = str(info.value)
    assert message.startswith("invalid pipeline parameters: node_selector: label key 'bad key'")
    assert "; tolerations[0]: operator 'In' is not one of Exists, Equal" in message
    assert "\n" not in message
    _check(node_selector=json.loads(GOOD_SELECTORS[2]), tolerations=json.loads(GOOD_TOLERATIONS[3]))


def test_the_train_tasks_config_is_refused_as_the_check_step_refuses_it() -> None:
    """What a pipeline author sets on the train task with kfp-kubernetes, which the check step
    does not see, is refused by the same rule when the train step reads its task config."""
    from kfp import dsl

    from components.train.step.program import pod_config

    passed = dsl.TaskConfig(node_selector={"bad key": "x"}, env=[{"name": "A", "value": "1"}])
    with pytest.raises(ValueError) as info:
        pod_config(passed)
    assert str(info.value).startswith("invalid placement: node_selector: label key 'bad key'")
    with pytest.raises(ValueError, match=r"tolerations\[0\]: unknown field 'efect'"):
        Placement(tolerations=[{"key": "a", "efect": "NoSchedule"}])
    assert Placement() == Placement({}, [])  # each its own empty ones
    assert Placement().node_selector is not Placement().node_selector


def test_tolerations_merge_without_repeating_one() -> None:
    team = {"key": "team", "value": "ml", "effect": "NoSchedule"}  # operator Equal, unset
    same_team = {"key": "team", "operator": "Equal", "value": "ml", "effect": "NoSchedule"}
    assert merge_tolerations([GPU, team], [same_team, dict(GPU)], [GPU]) == [GPU, team]
    other = {**team, "effect": "NoExecute"}
    assert merge_tolerations([team], [other]) == [team, other]
