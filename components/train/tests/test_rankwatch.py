"""The local launcher names a frozen rank and ends the job when it stays frozen (rankwatch)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import psutil
import pytest

from components.train.config import TrainConfig
from components.train.launch import run_local
from components.train.rankwatch import RankWatch, rank_processes


@pytest.fixture
def two_ranks() -> subprocess.Popen[bytes]:
    """A shell holding two long sleeps that carry HOROVOD_RANK 0 and 1, as horovodrun's do."""
    script = "env HOROVOD_RANK=0 sleep 60 & env HOROVOD_RANK=1 sleep 60 & wait"
    proc = subprocess.Popen(["sh", "-c", script], start_new_session=True)
    deadline = time.monotonic() + 10
    while len(rank_processes(proc.pid)) < 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    yield proc
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def _signal(proc: psutil.Process, sig: signal.Signals) -> None:
    """Send `sig` and wait until the kernel shows its effect (delivery is asynchronous)."""
    os.kill(proc.pid, sig)
    stopped = sig == signal.SIGSTOP
    deadline = time.monotonic() + 10
    while (proc.status() == psutil.STATUS_STOPPED) != stopped and time.monotonic() < deadline:
        time.sleep(0.01)


def test_a_stopped_rank_is_named_once_then_killed_after_the_bound(
    two_ranks: subprocess.Popen[bytes],
) -> None:
    ranks = rank_processes(two_ranks.pid)
    assert sorted(ranks) == [0, 1] and all(p.name() == "sleep" for p in ranks.values())
    lines: list[str] = []
    watch = RankWatch(two_ranks.pid, bound_s=5, log=lines.append)
    watch.poll(now=100.0)
    assert lines == []  # nobody is stopped
    _signal(ranks[1], signal.SIGSTOP)
    watch.poll(now=101.0)
    watch.poll(now=105.0)  # 4 s: within the bound
    assert lines == [
        f"launcher: rank 1 (pid {ranks[1].pid}) is stopped and the other ranks wait for it; "
        "the job ends if it is still stopped in 5 s"
    ]
    watch.poll(now=106.0)
    assert lines[1] == (
        f"launcher: rank 1 (pid {ranks[1].pid}) has been stopped for 5 s (stall bound 5 s): "
        "ending the job"
    )
    assert watch.ended_by == 1
    ranks[1].wait(timeout=10)  # killed (and reaped by the shell)
    assert not ranks[1].is_running()
    assert ranks[0].is_running() and ranks[0].status() != "stopped"


def test_a_rank_that_resumes_in_time_is_left_alone(two_ranks: subprocess.Popen[bytes]) -> None:
    ranks = rank_processes(two_ranks.pid)
    lines: list[str] = []
    watch = RankWatch(two_ranks.pid, bound_s=5, log=lines.append)
    _signal(ranks[0], signal.SIGSTOP)
    watch.poll(now=0.0)
    _signal(ranks[0], signal.SIGCONT)
    watch.poll(now=3.0)
    _signal(ranks[0], signal.SIGSTOP)
    watch.poll(now=6.0)  # stopped again: the clock starts over
    watch.poll(now=10.0)
    assert len(lines) == 2 and all("rank 0" in line and "is stopped" in line for line in lines)
    assert watch.ended_by is None and ranks[0].is_running()
    os.kill(ranks[0].pid, signal.SIGCONT)


@pytest.mark.horovod
def test_a_frozen_rank_of_a_real_job_is_named_and_ends_the_job(
    mnist_1000: str, tmp_path: Path
) -> None:
    config = TrainConfig(
        data=mnist_1000, output=str(tmp_path / "out"), workers=2, epochs=20,
        batch_size_per_worker=16, threads_per_worker=1, model="small",
    )  # fmt: skip
    lines: list[str] = []
    env = {**os.environ, "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": "3"}
    result: list[int] = []
    job = threading.Thread(target=lambda: result.append(run_local(config, 300, lines.append, env)))
    job.start()
    while not any("checkpoint after epoch 1 " in line for line in lines):
        assert job.is_alive(), "\n".join(lines)
        time.sleep(0.05)
    rank1 = rank_processes(os.getpid())[1]
    os.kill(rank1.pid, signal.SIGSTOP)
    job.join(300)
    assert result and result[0] != 0, "\n".join(lines)
    named = [line for line in lines if line.startswith("launcher: rank 1 ")]
    assert named == [
        f"launcher: rank 1 (pid {rank1.pid}) is stopped and the other ranks wait for it; the "
        "job ends if it is still stopped in 3 s",
        named[1],
    ]
    assert named[1].endswith("(stall bound 3 s): ending the job")
    assert not (tmp_path / "out" / "model").exists()
    assert json.loads((tmp_path / "out" / "checkpoints" / "latest.json").read_text())["epoch"] >= 1
