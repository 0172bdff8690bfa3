"""A stop (SIGTERM, Ctrl-C) of the local launchers ends everything they started, in one ``STOPPED:``
line and exit 128 + N: the heartbeat watch (``python -m components.train.launcher.mpiwatch``, the
launcher of a static job) over real mpirun, and elastic horovodrun (``python -m
components.train.launcher.launch``) with its real driver. The ranks are small programs, not the
trainer: what is tested is the processes. Leftovers are found by an environment mark every process
started inherits (`standins.commands.marked_processes`), wherever it was reparented."""

from __future__ import annotations

import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from components.common.failure import SIGNAL_BASE
from components.train.launcher.launch import (
    LocalHosts,
    elastic_launcher_args,
    horovodrun_command,
    job_environment,
)
from components.train.tests.test_mpiwatch import ROOT, mpirun, rank_pids
from standins.commands import marked_env, marked_processes
from standins.waiting import HANG_S, wait_until

# An elastic rank that only sleeps: says its rank and pid, as the watch's test ranks do.
SLEEPING_RANK = (
    "import os, sys, time; sys.stdout.write(f\"rank {os.environ['HOROVOD_RANK']} pid "
    '{os.getpid()}\\n"); sys.stdout.flush(); time.sleep(300)'
)


def stop_when_started(
    command: list[str], ranks: int, sig: signal.Signals, mark: str
) -> tuple[int, str]:
    """Start `command`, send `sig` once `ranks` ranks have said they run; (exit code, output)."""
    env = job_environment(marked_env(mark) | {"PYTHONPATH": str(ROOT)})
    proc = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
    )
    assert proc.stdout is not None
    seen = ""
    while len(rank_pids(seen)) < ranks:
        line = proc.stdout.readline()
        assert line, f"it ended before its ranks ran: {seen}"
        seen += line
    proc.send_signal(sig)
    rest, _ = proc.communicate(timeout=HANG_S)
    return proc.returncode, seen + rest


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["sigterm", "ctrl-c"])
def test_a_stopped_watch_ends_mpirun_and_its_ranks_in_one_line(sig: signal.Signals) -> None:
    """As the launcher container's PID 1 (the kubelet's SIGTERM) or at a terminal."""
    mark = uuid.uuid4().hex
    watch = [sys.executable, "-m", "components.train.launcher.mpiwatch", "--ranks", "2"]
    command = [*watch, "--silence-seconds", "60", "--", *mpirun("sleep", "300", "0")]
    code, output = stop_when_started(command, 2, sig, mark)
    assert code == SIGNAL_BASE + sig, output
    last = output.splitlines()[-1]
    assert last.startswith(f"STOPPED: {sig.name}: ended the Horovod job: mpirun (pid "), output
    assert last.endswith(" below it") and "2 x python" in last, last
    assert "Traceback" not in output
    assert marked_processes(mark) == []


def test_a_stopped_elastic_launcher_ends_its_driver_workers_in_one_line(tmp_path: Path) -> None:
    """``python -m components.train.launcher.launch`` (elastic horovodrun, the job a local elastic
    run
    starts), SIGTERMed: the ranks its driver started, each under a shell, are gone."""
    mark = uuid.uuid4().hex
    hosts = LocalHosts(tmp_path)
    hosts.offer(2)
    args = elastic_launcher_args(2, 1, hosts)
    command = horovodrun_command(args, [sys.executable, "-c", SLEEPING_RANK])
    code, output = stop_when_started(command, 2, signal.SIGTERM, mark)
    assert code == SIGNAL_BASE + signal.SIGTERM, output
    last = output.splitlines()[-1]
    assert last.startswith("STOPPED: SIGTERM: horovodrun ended the "), output
    assert "Traceback" not in output
    # at once, but for horovodrun's multiprocessing helper, which ends when it sees it gone
    assert [p for p in marked_processes(mark) if "resource_tracker" not in p] == []
    wait_until(lambda: not marked_processes(mark), lambda: f"left: {marked_processes(mark)}")


def test_a_command_the_watch_cannot_run_is_one_line() -> None:
    watch = [sys.executable, "-m", "components.train.launcher.mpiwatch", "--ranks", "2"]
    command = [*watch, "--silence-seconds", "5", "--", "/nonexistent/mpirun", "-np", "2"]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=HANG_S, cwd=ROOT)
    assert (proc.returncode, proc.stdout) == (2, "")
    assert proc.stderr.splitlines() == [
        "FAILED: cannot run /nonexistent/mpirun: No such file or directory"
    ]
