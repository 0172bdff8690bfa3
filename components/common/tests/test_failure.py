"""A step's program under `one_line_failures`, as its own process (as KFP's executor runs it):
an `ExpectedError` is one ``FAILED:`` line on stderr and its exit code; anything else, a
ValueError raised in the project's own code included, keeps its traceback."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from components.common.failure import SIGNAL_BASE, ExitCode

ROOT = Path(__file__).resolve().parents[3]


def run_step(body: str) -> subprocess.CompletedProcess:
    program = "\n".join(
        [
            "from components.common.failure import one_line_failures",
            "with one_line_failures():",
            f"    {body}",
        ]
    )
    return subprocess.run(
        [sys.executable, "-c", program], cwd=ROOT, capture_output=True, text=True, timeout=60
    )


@pytest.mark.parametrize(
    ("body", "line"),
    [
        (
            "from components.data_prep.sources import fetch; fetch('/nonexistent/mnist.npz')",
            "FAILED: /nonexistent/mnist.npz: not found",
        ),
        (
            "from components.common.declare import check; "
            "from pipeline.checks import PIPELINE_PARAMETERS; "
            "check(PIPELINE_PARAMETERS, {'workers': 0}, 'pipeline parameters')",
            "FAILED: invalid pipeline parameters: workers must be >= 1, got 0",
        ),
        # a RegistryError was a RuntimeError, which the handler let through with its traceback
        (
            "from components.register.registry import ModelStore; import pathlib; "
            "s = ModelStore('{tmp}', 'm'); pathlib.Path(s.alias_uri('production')).parent.mkdir("
            "parents=True); pathlib.Path(s.alias_uri('production')).write_text('[1]'); "
            "s.read_alias('production')",
            "FAILED: {tmp}/m/_aliases/production.json: expected a JSON object",
        ),
    ],
    ids=["bad input", "a refused parameter", "a registry error"],
)
def test_an_expected_error_is_one_failed_line_and_its_exit_code(
    body: str, line: str, tmp_path: Path
) -> None:
    proc = run_step(body.replace("{tmp}", str(tmp_path)))
    assert proc.returncode == ExitCode.BAD_INPUT, proc.stderr
    assert proc.stderr.splitlines() == [line.replace("{tmp}", str(tmp_path))]
    assert proc.stdout == ""


def test_an_expected_error_ends_with_its_own_exit_code() -> None:
    """A started run that failed (the CLI of run-local and the train step's cluster job) is not
    bad input: its code is the table's RUN_FAILED."""
    proc = run_step(
        "from components.train.launcher.cluster.job import ClusterJobFailed; "
        "raise ClusterJobFailed("
        "'MPIJob ns/x', 'BackoffLimitExceeded', 'launcher failed', ['a', 'b'])"
    )
    assert proc.returncode == ExitCode.RUN_FAILED
    assert proc.stderr.splitlines() == [
        "FAILED: MPIJob ns/x failed: BackoffLimitExceeded: launcher failed"
    ]


@pytest.mark.parametrize(
    ("body", "last"),
    [
        ("import json; json.loads('{')", "json.decoder.JSONDecodeError: Expecting property name"),
        ("{}['splits']", "KeyError: 'splits'"),
        # a plain ValueError from the project's own code is a broken invariant, not bad input
        (
            "from components.train.rank.data import shard_range; shard_range(10, 5, 2)",
            "ValueError: rank 5 is not in a world of size 2",
        ),
    ],
    ids=["a library's ValueError", "a bug", "the project's own ValueError"],
)
def test_an_unexpected_error_keeps_its_traceback(body: str, last: str) -> None:
    proc = run_step(body)
    assert proc.returncode == ExitCode.UNEXPECTED
    assert "FAILED" not in proc.stdout + proc.stderr
    assert proc.stderr.startswith("Traceback (most recent call last):")
    assert proc.stderr.splitlines()[-1].startswith(last)


# A step's program as KFP's executor runs it: it says it is ready, then works until stopped;
# its cleanup takes a while, and a second signal during it must not cut it short.
STOPPABLE = """
import sys, time
from components.common.failure import Stopped, one_line_failures, stops_on_signals
with one_line_failures(), stops_on_signals():
    try:
        print("ready", flush=True)
        time.sleep(300)
    except Stopped as stop:
        print("cleaning up", flush=True)
        time.sleep(1)
        stop.ended.append("ended the job it had started")
        raise
"""


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["sigterm", "ctrl-c"])
def test_a_stop_is_one_stopped_line_and_128_plus_n_and_a_second_signal_waits(
    sig: signal.Signals,
) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", STOPPABLE],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
    proc.send_signal(sig)
    assert proc.stdout.readline() == "cleaning up\n"
    proc.send_signal(sig)  # a second Ctrl-C while it cleans up: ignored
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == SIGNAL_BASE + sig, err
    assert err.splitlines() == [f"STOPPED: {sig.name}: ended the job it had started"]
