"""``make run MODEL=… AUGMENT=1`` -> ``python -m pipeline run-local --model … --augment`` -> the
pipeline's ``model`` and ``augment`` parameters; a bad model stops before any step runs."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from components.common.failure import ExitCode
from pipeline import local_run
from pipeline.cli import cli

ROOT = Path(__file__).resolve().parents[1]
TF_CPP_LOG = re.compile(r"^[IWEF]\d{4} [\d:.]+ +\d+ \w+\.cc:\d+\] ")  # absl's line prefix


def _make_run_command(tmp_path: Path, *variables: str) -> str:
    """The command ``make run VARIABLES`` would run (``make -n``, the install already done)."""
    stamp = tmp_path / "installed"
    stamp.touch()  # newer than the lock: `install` has nothing to do
    proc = subprocess.run(
        ["make", "-n", "-s", "run", f"STAMP={stamp}", f"PYTHON={sys.executable}", "PY=python",
         *variables],
        cwd=ROOT, capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    return " ".join(proc.stdout.replace("\\\n", " ").split())


def test_make_run_passes_model_augment_and_min_workers(tmp_path: Path) -> None:
    assert _make_run_command(tmp_path, "MODEL=small", "AUGMENT=1", "EPOCHS=3", "MIN_WORKERS=1") == (
        "python -m pipeline run-local --workers 2 --epochs 3 --model small --augment "
        "--min-workers 1"
    )
    assert _make_run_command(tmp_path) == (
        "python -m pipeline run-local --workers 2 --epochs 8 --model mnist_advanced --no-augment "
        "--min-workers 0"
    )


@pytest.fixture
def captured(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """What run-local hands to the pipeline (the run itself replaced: nothing is started)."""
    seen: dict[str, Any] = {}

    def fake_run(root: str, docker_images: Any = None, **params: Any) -> Any:
        seen.update(params)
        raise ValueError("stopped by the test")

    monkeypatch.setattr(local_run, "run_pipeline_locally", fake_run)
    return seen


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--model", "small", "--augment", "--min-workers", "1"], ("small", True, 1)),
        ([], ("mnist_advanced", False, 0)),
    ],
)
def test_run_local_passes_model_augment_and_min_workers_as_pipeline_parameters(
    captured: dict[str, Any], args: list[str], expected: tuple
) -> None:
    CliRunner().invoke(cli, ["run-local", *args])
    assert (captured["model"], captured["augment"], captured["min_workers"]) == expected


def test_run_local_help_lists_the_models() -> None:
    result = CliRunner().invoke(cli, ["run-local", "--help"])
    assert result.exit_code == 0
    text = " ".join(result.output.split())
    assert (
        "--model TEXT mnist_advanced, small or mobilenet_v3_small (for larger colour images), "
        "or a Python entry point package.module"
    ) in text
    assert "--augment / --no-augment" in text


@pytest.mark.parametrize(
    ("args", "code", "messages"),
    [
        (["--model", "resnet"], ExitCode.BAD_INPUT, ["model must be one of the built-in models "
         "mnist_advanced, small, mobilenet_v3_small or a Python entry point "
         "'package.module:function'"]),
        (["--model", "components.train.tests.user_model:missing"], ExitCode.PREFLIGHT,
         ["kfp-horovod preflight failed: model 'components.train.tests.user_model:missing': "
          "'missing' is not defined in module"]),
        (["--workers", "0", "--data-source", "ftp://nope"],  # every bad parameter at once
         ExitCode.BAD_INPUT, ["workers must be >= 1, got 0", "data_source must be"]),
    ],
)  # fmt: skip
def test_a_bad_parameter_stops_run_local_before_any_step(
    args: list[str], code: int, messages: list[str], tmp_path: Path
) -> None:
    result = CliRunner().invoke(cli, ["run-local", "--root", str(tmp_path), *args])
    assert result.exit_code == code, result.output
    # one line, no usage text; TensorFlow's C++ notes on import (a user's model is built once)
    # are TensorFlow's own
    (line,) = [ln for ln in result.stderr.splitlines() if not TF_CPP_LOG.match(ln)]
    assert line.startswith("FAILED: ") and all(message in line for message in messages)
    assert not (tmp_path / "pipeline-root").exists()


@pytest.mark.parametrize("backend", ["mpijob", "trainjob"])
def test_a_cluster_backend_stops_a_local_run_before_any_step(backend: str, tmp_path: Path) -> None:
    """Both cluster backends need a Kubeflow cluster; a local run says so, naming the value."""
    with pytest.raises(ValueError, match=f"training_backend must be 'local' for a local run "
                       rf"\(no cluster here\), got '{backend}'"):  # fmt: skip
        local_run.run_pipeline_locally(root=tmp_path, training_backend=backend)
    assert not (tmp_path / "pipeline-root").exists()
