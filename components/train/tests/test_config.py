"""The trainer's contract: TrainConfig <-> argv is one pair of functions, and they round-trip."""

from __future__ import annotations

import random
from typing import Any

import pytest

from components.train.config import TrainConfig, from_argv, to_argv


def random_config(rng: random.Random) -> TrainConfig:
    """A valid TrainConfig with every field varied (optional ones sometimes left unset)."""

    def maybe(value: str) -> str | None:
        return value if rng.random() < 0.5 else None

    return TrainConfig(
        data=rng.choice(["/d", "gs://b/data set", "rel/dir", "/tmp/--data"]),
        output=rng.choice(["/o", "gs://b/runs/r 1", "out"]),
        workers=(workers := rng.randint(1, 64)),
        slots_per_worker=rng.choice([1, 1, 2, 8]),
        epochs=rng.randint(1, 500),
        batch_size_per_worker=rng.randint(1, 4096),
        learning_rate=rng.choice([1e-6, 0.001, 1 / 3, 0.1 + 0.2, 10.0, rng.uniform(1e-9, 10)]),
        warmup_epochs=rng.randint(0, 10),
        threads_per_worker=rng.randint(0, 32),
        seed=rng.randint(0, 2**31),
        model=rng.choice(["mnist_advanced", "small", "team.models:build"]),
        augment=(augment := rng.random() < 0.5),
        model_dir=maybe(rng.choice(["gs://b/m", "/m"])),
        checkpoint_dir=maybe(rng.choice(["gs://b/c", "/c d"])),
        compression=rng.choice(["none", "fp16"]),
        backward_passes_per_step=(passes := rng.choice([1, 1, 2, 8])),
        jit_compile=not augment and rng.random() < 0.5,  # the two are refused together
        inter_op_threads=rng.choice([0, 0, 1, 4]),
        # elastic (1..workers) or static (0); elastic refuses backward passes > 1
        min_workers=rng.randint(1, workers) if passes == 1 and rng.random() < 0.4 else 0,
    )


@pytest.mark.parametrize("seed", range(300))
def test_argv_round_trips_every_field(seed: int) -> None:
    config = random_config(random.Random(seed))
    argv = to_argv(config)
    assert from_argv(argv) == config
    assert to_argv(from_argv(argv)) == argv


def test_flags_keep_their_user_names() -> None:
    config = TrainConfig(
        data="/d", output="/o", workers=3, slots_per_worker=2, batch_size_per_worker=16,
        learning_rate=0.01, threads_per_worker=2, model_dir="/m", checkpoint_dir="/c",
    )  # fmt: skip
    argv = to_argv(config)
    flag = dict(zip(argv[::2], argv[1::2], strict=True))
    assert flag["--expected-workers"] == "6"  # the world size: workers x slots
    assert flag["--slots-per-worker"] == "2"
    assert (flag["--batch-size"], flag["--learning-rate"]) == ("16", "0.01")
    assert (flag["--threads-per-worker"], flag["--model-dir"], flag["--checkpoint-dir"]) == (
        "2", "/m", "/c",
    )  # fmt: skip
    plain = to_argv(TrainConfig(data="/d", output="/o", workers=2))
    for optional in ("--slots-per-worker", "--threads-per-worker", "--model-dir", "--augment"):
        assert optional not in plain
    assert plain[plain.index("--model") + 1] == "mnist_advanced"  # the default, said explicitly


def test_model_and_augment_flags() -> None:
    config = TrainConfig(data="/d", output="/o", workers=2, model="team.models:build", augment=True)
    argv = to_argv(config)
    assert argv[argv.index("--model") + 1] == "team.models:build" and "--augment" in argv
    parsed = from_argv(["--data", "/d", "--output", "/o", "--expected-workers", "2"])
    assert (parsed.model, parsed.augment) == ("mnist_advanced", False)
    small = from_argv(["--data", "/d", "--output", "/o", "--expected-workers", "1", "--model",
                       "small", "--augment"])  # fmt: skip
    assert (small.model, small.augment) == ("small", True)


def test_levers_have_one_flag_each_and_are_off_by_default() -> None:
    plain = TrainConfig(data="/d", output="/o", workers=2)
    assert (plain.compression, plain.backward_passes_per_step) == ("none", 1)
    assert (plain.jit_compile, plain.inter_op_threads) == (False, 0)
    assert not [a for a in to_argv(plain) if a.startswith(("--comp", "--back", "--jit", "--inter"))]
    on = TrainConfig(
        data="/d", output="/o", workers=2, compression="fp16", backward_passes_per_step=4,
        jit_compile=True, inter_op_threads=3,
    )  # fmt: skip
    argv = to_argv(on)
    assert argv[argv.index("--compression") + 1] == "fp16"
    assert argv[argv.index("--backward-passes-per-step") + 1] == "4"
    assert argv[argv.index("--inter-op-threads") + 1] == "3"
    assert "--jit-compile" in argv
    assert from_argv(argv) == on


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--expected-workers", "0"], "--expected-workers must be >= 1, got 0"),
        (["--expected-workers", "2", "--batch-size", "0"], "--batch-size must be >= 1, got 0"),
        (["--expected-workers", "2", "--learning-rate", "0"], "--learning-rate must be in (0, 10]"),
        (["--expected-workers", "2", "--epochs", "0"], "--epochs must be >= 1, got 0"),
        (["--expected-workers", "2", "--threads-per-worker", "-1"], "--threads-per-worker must"),
        (["--expected-workers", "2", "--warmup-epochs", "-1"], "--warmup-epochs must be >= 0"),
        (
            ["--expected-workers", "5", "--slots-per-worker", "2"],
            "--expected-workers 5 is not a multiple of --slots-per-worker 2",
        ),
        (["--expected-workers", "2", "--data", ""], "data is empty"),
        (
            ["--expected-workers", "2", "--model", "resnet"],
            "--model must be one of the built-in models mnist_advanced, small or a Python entry "
            "point 'package.module:function'",
        ),
        (["--expected-workers", "2", "--model", "a.b"], "got 'a.b'"),
        (
            ["--expected-workers", "2", "--augment", "--jit-compile"],
            "--augment cannot be combined with --jit-compile",
        ),
        (
            ["--expected-workers", "2", "--compression", "fp8"],
            "--compression must be one of none, fp16, got 'fp8'",
        ),
        (
            ["--expected-workers", "2", "--backward-passes-per-step", "0"],
            "--backward-passes-per-step must be >= 1, got 0",
        ),
        (
            ["--expected-workers", "2", "--inter-op-threads", "-1"],
            "--inter-op-threads must be >= 0, got -1",
        ),
        (["--expected-workers", "2", "--min-workers", "-1"], "--min-workers must be >= 0, got -1"),
        (
            ["--expected-workers", "2", "--min-workers", "3"],
            "--min-workers must be <= --expected-workers (the most workers an elastic job runs "
            "with), got 3 > 2",
        ),
        (
            ["--expected-workers", "2", "--min-workers", "1", "--backward-passes-per-step", "2"],
            "--min-workers (elastic training) cannot be combined with --backward-passes-per-step",
        ),
    ],
)
def test_bad_flags_exit_2_naming_the_flag(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as info:
        from_argv(["--data", "/d", "--output", "/o", *args])
    assert info.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(
    ("field", "value"),
    [("workers", 0), ("slots_per_worker", 0), ("epochs", 0), ("batch_size_per_worker", 0),
     ("learning_rate", 0.0), ("learning_rate", 10.5), ("warmup_epochs", -1),
     ("threads_per_worker", -1), ("data", ""), ("output", ""), ("model", "resnet"),
     ("model", "pkg.mod"), ("augment", "yes"), ("compression", "int8"),
     ("backward_passes_per_step", 0), ("inter_op_threads", -1), ("min_workers", -1),
     ("min_workers", 3)],
)  # fmt: skip
def test_bad_fields_are_refused_by_name(field: str, value: Any) -> None:
    fields: dict[str, Any] = {"data": "/d", "output": "/o", "workers": 2, field: value}
    with pytest.raises(ValueError, match=rf"\b{field}\b"):
        TrainConfig(**fields)


def test_uris_derive_from_output_once() -> None:
    c = TrainConfig(data="/d", output="gs://b/out", workers=1)
    assert (c.model_uri, c.checkpoint_uri, c.summary_uri) == (
        "gs://b/out/model", "gs://b/out/checkpoints", "gs://b/out/run_summary.json",
    )  # fmt: skip
    moved = TrainConfig(data="/d", output="/o", workers=1, model_dir="/m", checkpoint_dir="/c")
    assert (moved.model_uri, moved.checkpoint_uri) == ("/m", "/c")
