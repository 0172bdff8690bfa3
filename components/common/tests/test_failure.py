"""A step's program under `one_line_failures`, as its own process (as KFP's executor runs it):
an expected error is one ``FAILED:`` line and exit 2; anything else keeps its traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


def run_step(body: str) -> subprocess.CompletedProcess:
    program = "\n".join([
        "from components.common.failure import one_line_failures",
        "with one_line_failures():",
        f"    {body}",
    ])  # fmt: skip
    return subprocess.run(
        [sys.executable, "-c", program], cwd=ROOT, capture_output=True, text=True, timeout=60
    )


@pytest.mark.parametrize(
    ("body", "line"),
    [
        ("from components.data_prep.sources import fetch; fetch('/nonexistent/mnist.npz')",
         "FAILED: /nonexistent/mnist.npz: not found"),
        ("from components.common.declare import check; from pipeline.checks import "
         "PIPELINE_PARAMETERS; check(PIPELINE_PARAMETERS, {'workers': 0}, 'pipeline parameters')",
         "FAILED: invalid pipeline parameters: workers must be >= 1, got 0"),
    ],
    ids=["bad input", "a refused parameter"],
)  # fmt: skip
def test_an_expected_error_is_one_failed_line_and_exit_2(body: str, line: str) -> None:
    proc = run_step(body)
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout.splitlines() == [line]
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize(
    ("body", "last"),
    [
        ("import json; json.loads('{')", "json.decoder.JSONDecodeError: Expecting property name"),
        ("{}['splits']", "KeyError: 'splits'"),
    ],
    ids=["a library's ValueError", "a bug"],
)
def test_an_unexpected_error_keeps_its_traceback(body: str, last: str) -> None:
    proc = run_step(body)
    assert proc.returncode == 1
    assert "FAILED" not in proc.stdout
    assert proc.stderr.startswith("Traceback (most recent call last):")
    assert proc.stderr.splitlines()[-1].startswith(last)
