"""The trainer's contract: TrainConfig's declared fields <-> argv, one pair of functions that
round-trip, with one flag per field under the field's own name; and the lr_scaling rules,
Adam's settings for a world size."""

from __future__ import annotations

import math
import re
from typing import Any

import pytest

from components.train.config import TrainConfig, adam_settings, from_argv, to_argv
from components.train.summary import lr_formula

# Each case is one way a value could be lost between the launcher's argv and a rank's config.
EVERY_FIELD_AWAY_FROM_ITS_DEFAULT = TrainConfig(
    data="gs://b/data set",  # a space: one argv word, not two
    output="/tmp/--output",  # a dash-dash inside a value
    workers=5,
    slots_per_worker=2,
    epochs=3,
    batch_size_per_worker=7,
    learning_rate=0.1 + 0.2,  # 0.30000000000000004: every digit must survive
    warmup_epochs=0,
    lr_scaling="none",
    threads_per_worker=3,
    model="team.models:build",
    augment=True,
    min_workers=4,
    mixed_precision=True,
    gpus_per_worker=2,
    seed=0,
    model_dir="/m",
    checkpoint_dir="gs://b/c d",
)
ROUND_TRIPS = {
    "every field away from its default": EVERY_FIELD_AWAY_FROM_ITS_DEFAULT,
    "every field at its default": TrainConfig(data="/d", output="/o"),
    "a third": TrainConfig(data="/d", output="/o", learning_rate=1 / 3),
    "a learning rate below str's fixed notation": TrainConfig(
        data="/d", output="/o", learning_rate=1.2345678901234567e-9
    ),
    "the sqrt rule at its most ranks": TrainConfig(
        data="d", output="o", workers=3, slots_per_worker=3, lr_scaling="sqrt"
    ),
}


def test_the_round_trip_cases_vary_every_field() -> None:
    """A field added to TrainConfig without a case that moves it off its default fails here."""
    moved = {
        name
        for name, field in TrainConfig.__dataclass_fields__.items()
        if getattr(EVERY_FIELD_AWAY_FROM_ITS_DEFAULT, name) != field.default
    }
    assert moved == set(TrainConfig.__dataclass_fields__)


@pytest.mark.parametrize("config", ROUND_TRIPS.values(), ids=ROUND_TRIPS.keys())
def test_argv_round_trips_every_field(config: TrainConfig) -> None:
    argv = to_argv(config)
    assert from_argv(argv) == config
    assert to_argv(from_argv(argv)) == argv


def test_a_switch_set_back_to_its_default_round_trips_too() -> None:
    """``--no-augment`` after ``--augment``: the last one wins, as argparse's flags do."""
    argv = to_argv(EVERY_FIELD_AWAY_FROM_ITS_DEFAULT) + ["--no-augment", "--no-mixed-precision"]
    config = from_argv(argv)
    assert (config.augment, config.mixed_precision) == (False, False)
    assert "--augment" not in to_argv(config) and "--no-augment" not in to_argv(config)


def test_every_field_has_one_flag_under_its_own_name() -> None:
    config = TrainConfig(
        data="/d",
        output="/o",
        workers=3,
        slots_per_worker=2,
        batch_size_per_worker=16,
        learning_rate=0.01,
        threads_per_worker=2,
        model_dir="/m",
        checkpoint_dir="/c",
        model="team.models:build",
        augment=True,
    )
    argv = to_argv(config)
    argv.remove("--augment")  # a switch, no value: --augment or --no-augment
    flag = dict(zip(argv[::2], argv[1::2], strict=True))
    assert flag["--model"] == "team.models:build"
    assert (flag["--workers"], flag["--slots-per-worker"]) == ("3", "2")  # no world-size flag
    assert (flag["--batch-size-per-worker"], flag["--learning-rate"]) == ("16", "0.01")
    assert (flag["--threads-per-worker"], flag["--model-dir"], flag["--checkpoint-dir"]) == (
        "2",
        "/m",
        "/c",
    )
    assert {p.flag for p in TrainConfig.parameters()} == {
        "--" + name.replace("_", "-") for name in TrainConfig.__dataclass_fields__
    }
    plain = to_argv(TrainConfig(data="/d", output="/o", workers=2))
    assert plain == ["--data", "/d", "--output", "/o"]  # the defaults (workers 2 too) left out
    assert from_argv([*plain, "--no-augment"]).augment is False


BAD_FIELDS = [
    ("workers", 0, "workers must be >= 1, got 0"),
    ("slots_per_worker", 0, "slots_per_worker must be >= 1, got 0"),
    ("epochs", 0, "epochs must be >= 1, got 0"),
    ("batch_size_per_worker", 0, "batch_size_per_worker must be >= 1, got 0"),
    ("learning_rate", 0.0, "learning_rate must be > 0, got 0.0"),
    ("learning_rate", 11.0, "learning_rate must be <= 10, got 11.0"),
    ("warmup_epochs", -1, "warmup_epochs must be >= 0, got -1"),
    ("threads_per_worker", -1, "threads_per_worker must be >= 0, got -1"),
    ("data", "", "data is empty"),
    ("output", "", "output is empty"),
    (
        "model",
        "resnet",
        "model must be one of the built-in models mnist_advanced, small, "
        "mobilenet_v3_small or a Python entry point 'package.module:function'",
    ),
    ("model", "a.b", "got 'a.b'"),
    ("lr_scaling", "cubic", "lr_scaling must be one of linear, sqrt, none, got 'cubic'"),
    ("min_workers", -1, "min_workers must be >= 0, got -1"),
    (
        "min_workers",
        3,
        "min_workers must be <= workers (the most workers an elastic job runs with), got 3 > 2",
    ),
    ("gpus_per_worker", -1, "gpus_per_worker must be >= 0, got -1"),
    ("seed", -1, "seed must be >= 0, got -1"),
]


@pytest.mark.parametrize(("field", "value", "message"), BAD_FIELDS)
def test_a_bad_field_is_refused_by_name_and_its_flag_exits_2(
    field: str, value: Any, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    fields: dict[str, Any] = {"data": "/d", "output": "/o", "workers": 2, field: value}
    with pytest.raises(ValueError, match=re.escape(message)):
        TrainConfig(**fields)
    with pytest.raises(SystemExit) as info:
        from_argv(["--data", "/d", "--output", "/o", "--" + field.replace("_", "-"), str(value)])
    assert info.value.code == 2
    assert message in capsys.readouterr().err


def test_a_flag_of_the_wrong_type_or_a_non_bool_switch_is_refused(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit):
        from_argv(["--data", "/d", "--output", "/o", "--workers", "x"])
    assert "Invalid value for '--workers': 'x' is not a valid integer" in capsys.readouterr().err
    with pytest.raises(ValueError, match="augment must be true or false, got 'yes'"):
        TrainConfig(data="/d", output="/o", augment="yes")  # type: ignore[arg-type]


def test_uris_derive_from_output_once() -> None:
    c = TrainConfig(data="/d", output="gs://b/out", workers=1)
    assert (c.model_uri, c.checkpoint_uri, c.summary_uri, c.tensorboard_uri) == (
        "gs://b/out/model",
        "gs://b/out/checkpoints",
        "gs://b/out/run_summary.json",
        "gs://b/out/tensorboard",
    )
    moved = TrainConfig(data="/d", output="/o", workers=1, model_dir="/m", checkpoint_dir="/c")
    assert (moved.model_uri, moved.checkpoint_uri) == ("/m", "/c")


ONE = {"learning_rate": 0.001, "beta_1": 0.9, "beta_2": 0.999, "epsilon": 1e-7}


@pytest.mark.parametrize(
    ("rule", "k", "adam", "words"),
    [
        ("linear", 4, {**ONE, "learning_rate": 0.004}, "0.004 = 0.001 x 4 workers (linear)"),
        ("none", 4, ONE, "0.001 = 0.001 for 4 workers (none)"),
        ("sqrt", 1, ONE, "0.001 = 0.001 x sqrt(1 workers) (sqrt)"),  # one rank: unchanged
        # Malladi et al.: a batch k = 2 times larger
        (
            "sqrt",
            2,
            {
                "learning_rate": 0.001 * math.sqrt(2),
                "beta_1": 0.8,
                "beta_2": 0.998,
                "epsilon": 1e-7 / math.sqrt(2),
            },
            "0.00141421 = 0.001 x sqrt(2 workers) (sqrt)",
        ),
    ],
)
def test_each_rule_sets_adam_for_the_world_size_and_says_so_in_words(
    rule: str, k: int, adam: dict[str, float], words: str
) -> None:
    settings = adam_settings(rule, 0.001, k)
    assert settings == pytest.approx(adam)
    assert lr_formula(rule, 0.001, k, settings["learning_rate"]) == words


def test_sqrt_beyond_its_range_is_refused_by_name() -> None:
    # the rule's words: components/common/tests/test_params.py
    with pytest.raises(ValueError, match="lr_scaling 'sqrt' works for at most 9 ranks"):
        TrainConfig(data="d", output="o", workers=10, lr_scaling="sqrt")
