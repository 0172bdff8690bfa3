"""``make run``'s console: the steps' own lines and the summary; everything else in the log."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

from pipeline import local_run
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


STEP = "\x1b[96m'prepare-data'\x1b[0m"  # kfp.local colours the task's name
KFP_FAILED = (
    f"Pipeline 'kfp-horovod-mnist' finished with status FAILURE. Inner task failed: {STEP}."
)


@pytest.mark.parametrize(
    ("step_output", "reason"),
    [
        (["FAILED: /nonexistent/mnist.npz: not found"], "/nonexistent/mnist.npz: not found"),
        (
            ["Traceback (most recent call last):", '  File "x.py", line 1, in <module>',
             "KeyError: 'splits'"],
            "KeyError: 'splits' (an unexpected error: its traceback is in the log)",
        ),
    ],
    ids=["expected", "unexpected"],
)  # fmt: skip
def test_a_failed_step_ends_the_console_with_one_failed_line_and_the_log(
    step_output: list[str], reason: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """What kfp.local prints of a failed step, then its exception: the console's last two lines
    are ``FAILED: step '<name>': <reason>`` and the log's path; the log keeps everything."""
    log = tmp_path / "run.log"
    with pytest.raises(local_run.RunFailed) as info, quiet_console(log):
        print(f"19:12:15.559 - INFO - Executing task {STEP}")
        print("\n".join("    " + line for line in step_output))
        print(f"19:12:16.855 - ERROR - Task {STEP} finished with status FAILURE")
        raise RuntimeError(KFP_FAILED)
    console = capsys.readouterr().out.splitlines()
    assert console[-2:] == [f"FAILED: step 'prepare-data': {reason}", f"log: {log}"]
    assert "Traceback" not in "\n".join(console)
    assert (info.value.step, info.value.reason) == ("prepare-data", reason)
    assert all(line in log.read_text() for line in step_output)


def test_an_error_outside_any_step_is_named_by_its_type_and_its_traceback_logged(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = tmp_path / "run.log"
    with pytest.raises(local_run.RunFailed), quiet_console(log):
        print(f"19:12:15.559 - INFO - Executing task {STEP}")
        print(f"19:12:16.855 - INFO - Task {STEP} finished with status \x1b[92mSUCCESS\x1b[0m")
        raise OSError("docker daemon not running")
    console = capsys.readouterr().out.splitlines()
    assert console[-2:] == ["FAILED: OSError: docker daemon not running", f"log: {log}"]
    assert "Traceback (most recent call last):" in log.read_text()
