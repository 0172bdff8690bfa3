"""``make run``'s console: the steps' own lines and the summary; everything else in the log."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

from pipeline.local_run import quiet_console

LINES = [
    "00:46:58.341 - INFO - Executing task 'train'",
    '{"inputs": {"parameterValues": {"epochs": 8}}}',  # kfp.local's executor echo
    "    [1,0]<stdout>:[rank 0/2] Epoch 1/8 - loss 0.9843",
    "    [1,1]<stderr>:2026-12-04 00:46:59.1: I tensorflow/core/util/port.cc:153] oneDNN ...",
    "mpiwatch: watching 2 rank(s)",
]


def test_the_console_shows_the_steps_lines_and_the_log_keeps_everything(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = tmp_path / "logs" / "run.log"
    with quiet_console(log):
        print("\n".join(LINES))
        warnings.warn("You may be attemping to run a task that uses custom images", stacklevel=1)
    console = capsys.readouterr().out.splitlines()
    assert console == [LINES[0], "    [rank 0/2] Epoch 1/8 - loss 0.9843", LINES[4]]
    assert log.read_text().splitlines() == LINES


def test_a_failed_run_shows_the_logs_last_lines_and_its_path(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = tmp_path / "run.log"
    with pytest.raises(RuntimeError, match="task train failed"), quiet_console(log):
        print("Traceback (most recent call last): ... ValueError: bad shard")
        raise RuntimeError("task train failed")
    console = capsys.readouterr().out
    assert "--- the run's log, last lines ---" in console
    assert "ValueError: bad shard" in console and console.rstrip().endswith(f"log: {log}")
