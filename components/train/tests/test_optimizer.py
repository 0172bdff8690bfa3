"""The lr_scaling rules: Adam's settings for a world size, and the parameter's checks."""

from __future__ import annotations

import math

import pytest

from components.common.params import joint_problems, problems
from components.train.config import TRAIN_PARAMETERS, TrainConfig, from_argv, to_argv
from components.train.summary import lr_formula
from components.train.trainer import adam_settings


def test_linear_sqrt_and_none() -> None:
    one = {"learning_rate": 0.001, "beta_1": 0.9, "beta_2": 0.999, "epsilon": 1e-7}
    assert adam_settings("linear", 0.001, 4) == {**one, "learning_rate": 0.004}
    assert adam_settings("none", 0.001, 4) == one
    sqrt = adam_settings("sqrt", 0.001, 2)  # Malladi et al.: a batch k = 2 times larger
    assert sqrt["learning_rate"] == pytest.approx(0.001 * math.sqrt(2))
    assert (sqrt["beta_1"], sqrt["beta_2"]) == (pytest.approx(0.8), pytest.approx(0.998))
    assert sqrt["epsilon"] == pytest.approx(1e-7 / math.sqrt(2))
    assert adam_settings("sqrt", 0.001, 1) == one  # one rank: unchanged
    with pytest.raises(ValueError, match="unknown lr_scaling rule 'cubic'"):
        adam_settings("cubic", 0.001, 2)


def test_the_rule_in_words() -> None:
    assert lr_formula("linear", 0.001, 2, 0.002) == "0.002 = 0.001 x 2 workers (linear)"
    assert lr_formula("sqrt", 0.001, 4, 0.002) == "0.002 = 0.001 x sqrt(4 workers) (sqrt)"
    assert lr_formula("none", 0.001, 4, 0.001) == "0.001 = 0.001 for 4 workers (none)"


def test_a_bad_rule_and_sqrt_beyond_its_range_are_refused_by_name() -> None:
    assert problems(TRAIN_PARAMETERS, {"lr_scaling": "cubic"}) == [
        "lr_scaling must be one of linear, sqrt, none, got 'cubic'"
    ]
    assert joint_problems({"lr_scaling": "sqrt", "workers": 5, "slots_per_worker": 2}) == [
        "lr_scaling 'sqrt' works for at most 9 ranks (it sets Adam's beta_1 = 1 - ranks x 0.1), "
        "got 10"
    ]
    with pytest.raises(ValueError, match="lr_scaling 'sqrt' works for at most 9 ranks"):
        TrainConfig(data="d", output="o", workers=10, lr_scaling="sqrt")


def test_the_trainer_flag_round_trips() -> None:
    config = TrainConfig(data="d", output="o", workers=2, lr_scaling="sqrt")
    assert "--lr-scaling" in to_argv(config) and from_argv(to_argv(config)) == config
    assert "--lr-scaling" not in to_argv(TrainConfig(data="d", output="o", workers=2))
