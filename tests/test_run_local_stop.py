"""A stop is a stop: SIGTERM to ``python -m pipeline run-local`` (what ``kill PID``, a supervisor
or an IDE's stop button sends), Ctrl-C to its process group, and SIGTERM to the train step's own
program each end everything the run started (the KFP executor, mpirun, both ranks, the heartbeat
watch) within `local_run.STOP_GRACE_S`, in one line. Leftovers are found by an environment mark
every process of the run inherits (`standins.commands.marked_processes`), wherever a process was
reparented: before, the executor, mpirun and both ranks were left training under PID 1.

Real runs: the real pipeline with kfp.local, a real 2-rank mpirun job of the ``small`` model."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import psutil
import pytest

from components.common.failure import SIGNAL_BASE, ExitCode
from pipeline.local_run import STOP_GRACE_S
from standins.commands import marked_env, marked_processes

pytestmark = [pytest.mark.e2e, pytest.mark.horovod]
ROOT = Path(__file__).resolve().parents[1]
TRAINING = "[rank 0/2] Epoch 1/"  # the job trains: every process of the run has started


def the_train_steps_program(run_local: int) -> int:
    """The pid of the train step's own program: kfp.local's executor running ``train``."""
    for proc in psutil.Process(run_local).children(recursive=True):
        command = proc.cmdline()
        if "kfp.dsl.executor_main" in command and command[-1:] == ["train"]:
            return int(proc.pid)
    raise AssertionError("no train step running")


@pytest.mark.parametrize("how", ["sigterm", "ctrl-c", "sigterm-to-the-step"])
def test_a_stopped_run_leaves_no_process_and_says_what_it_stopped(how: str, tmp_path: Path) -> None:
    mark = uuid.uuid4().hex
    options = ["--workers", "2", "--epochs", "50", "--model", "small", "--data-limit", "1000"]
    command = [sys.executable, "-m", "pipeline", "run-local", "--root", str(tmp_path), *options]
    proc = subprocess.Popen(
        command,
        cwd=ROOT,
        env=marked_env(mark),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    assert proc.stdout is not None
    console = []
    for line in proc.stdout:
        console.append(line.rstrip("\n"))
        if TRAINING in line:
            break
    assert console and TRAINING in console[-1], console
    if how == "sigterm":  # to run-local alone
        proc.send_signal(signal.SIGTERM)
    elif how == "ctrl-c":  # the terminal's SIGINT, to the whole foreground group
        os.killpg(proc.pid, signal.SIGINT)
    else:  # KFP's SIGTERM to the step's pod, here to its program alone
        os.kill(the_train_steps_program(proc.pid), signal.SIGTERM)
    console += proc.communicate(timeout=STOP_GRACE_S + 120)[0].splitlines()
    said, log = console[-2:]
    assert log.startswith(f"log: {tmp_path}/logs/run-local-"), console
    assert "Traceback" not in "\n".join(console)
    if how == "sigterm-to-the-step":  # the run failed: its step was stopped by someone else
        assert proc.returncode == ExitCode.RUN_FAILED, console
        assert said.startswith(
            "FAILED: step 'train': stopped by SIGTERM: ended the Horovod job: mpirun (pid "
        ), said
    else:
        sig = signal.SIGTERM if how == "sigterm" else signal.SIGINT
        assert proc.returncode == SIGNAL_BASE + sig, console
        assert said.startswith(f"STOPPED: {sig.name}: step 'train' stopped; ended the "), said
        assert "mpirun" in said and said.endswith("; none is left"), said
    # at once: run-local exits only once all it started has ended (orphans die late by themselves)
    assert marked_processes(mark) == []
