"""A line every rank prints alike reaches the train step's log once; each rank's own lines and
mpirun's tags are kept. The output is a real ``mpirun --tag-output`` job's (three ranks)."""

from __future__ import annotations

import subprocess
import sys

from components.train.launch import job_environment
from components.train.mpirun import mpirun_command
from components.train.ranklines import RankLines

# Each line in one write, as the trainer's logging writes it (the job runs unbuffered).
PROGRAM = """
import os, sys
rank = os.environ["OMPI_COMM_WORLD_RANK"]
sys.stdout.write("a warning every rank prints\\n")
sys.stdout.write(f"[rank {rank}/3] my own line\\n")
"""


def test_a_line_every_rank_prints_reaches_the_log_once_with_its_first_ranks_tag() -> None:
    command = mpirun_command(3, [sys.executable, "-c", PROGRAM], hosts="localhost:3")
    proc = subprocess.run(
        command, capture_output=True, text=True, timeout=120, env=job_environment(), check=True
    )
    raw = proc.stdout.splitlines()
    assert sum("a warning every rank prints" in line for line in raw) == 3  # mpirun: one a rank
    shown: list[str] = []
    once = RankLines(shown.append)
    for line in raw:
        once(line)
    shared = [line for line in shown if line.endswith("a warning every rank prints")]
    assert len(shared) == 1 and shared[0] in raw
    own = sorted(line for line in shown if "my own line" in line)
    assert own == [f"[1,{r}]<stdout>:[rank {r}/3] my own line" for r in range(3)]
    assert len(shown) == 4


def test_lines_that_mpirun_did_not_tag_all_pass() -> None:
    shown: list[str] = []
    once = RankLines(shown.append)
    for line in ["mpiwatch: watching 2 rank(s)", "", "", "mpiwatch: watching 2 rank(s)"]:
        once(line)
    assert shown == ["mpiwatch: watching 2 rank(s)", "", "", "mpiwatch: watching 2 rank(s)"]
