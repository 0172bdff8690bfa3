"""The preflight: N processes that are not one job stop at once, with an explanation."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from components.common.failure import ExitCode
from components.train.launcher.launch import job_environment
from components.train.rank.world_size import world_size_problem


def test_message_explains_independent_copies_and_the_fix() -> None:
    assert world_size_problem(3, 3, rank=0) is None
    assert world_size_problem(2, 3, rank=0, fewest=2) is None  # elastic: 2 to 3 ranks
    message = world_size_problem(1, 3, rank=0)
    assert message is not None
    assert "independent copies, not one job" in message
    assert "horovodrun -np 3" in message and "MPIJob" in message


@pytest.mark.horovod
def test_independent_copies_fail_at_once(mnist_1000: str, tmp_path: Path) -> None:
    """The symptom the check names: 3 copies of the script, each a world of 1. All three must
    stop."""
    args = ["--data", mnist_1000, "--output", str(tmp_path / "out"), "--workers", "3"]
    command = [sys.executable, "-m", "components.train.rank", *args]
    pipe, env = subprocess.PIPE, job_environment()
    procs = [
        subprocess.Popen(command, stdout=pipe, stderr=pipe, text=True, env=env) for _ in range(3)
    ]
    for proc in procs:
        out, err = proc.communicate(timeout=180)
        assert proc.returncode == ExitCode.PREFLIGHT, out + err
        assert "[rank 0/1]" in err and "independent copies, not one job" in err
    assert not (tmp_path / "out").exists(), "nothing may be written"


@pytest.mark.horovod
@pytest.mark.parametrize(
    ("ranks", "min_workers", "said"),
    [
        (2, "0", "This process is in a Horovod job of 2 worker(s)"),
        (1, "2", "fewer than its minimum of 2"),
    ],
    ids=["static", "elastic-below-minimum"],
)
def test_job_of_the_wrong_size_fails_on_every_rank(
    ranks: int, min_workers: str, said: str, mnist_1000: str, tmp_path: Path, run_job: Any
) -> None:
    """2 ranks of a job for 3; 1 rank of an elastic job of 2 to 3 workers."""
    args = [
        "--data",
        mnist_1000,
        "--output",
        str(tmp_path / "out"),
        "--workers",
        "3",
        "--min-workers",
        min_workers,
    ]
    proc = run_job(ranks, args, timeout=180)
    assert proc.returncode != 0
    for rank in range(ranks):
        assert f"kfp-horovod preflight failed [rank {rank}/{ranks}]" in proc.stderr, proc.stderr
    assert said in proc.stderr
    assert not (tmp_path / "out").exists()
