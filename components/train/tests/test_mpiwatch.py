"""The watch of a static job and the ranks' heartbeat: `Silence` on lines as mpirun's
``--tag-output`` writes them; real ``mpirun`` with 2 ranks of `beating_rank.py`; the real
trainer, launched locally."""

from __future__ import annotations

import contextlib
import io
import os
import re
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from components.common.failure import ExitCode
from components.train.config import TrainConfig
from components.train.launcher import mpiwatch
from components.train.launcher.launch import job_environment, run_local
from components.train.launcher.mpiwatch import Silence, expected_hosts
from components.train.rank import checkpoints, heartbeat
from components.train.rank.heartbeat import HEARTBEAT_ENV, MARK
from standins.commands import rank_processes
from standins.waiting import HANG_S, join, wait_until

RANK_PROGRAM = Path(__file__).with_name("beating_rank.py")
ROOT = Path(__file__).resolve().parents[3]
BEAT = "kfp-horovod-heartbeat beat host=w1 pid=7"
HOST = socket.gethostname()


def test_heartbeats_are_taken_out_and_the_rest_forwarded() -> None:
    silence = Silence(2, bound_s=10, now=0.0, expected=[])
    assert silence.observe(f"[1,1]<stdout>:{BEAT}", now=1.0) is None
    line = "[1,0]<stdout>:[rank 0/2] Epoch 1/2 - loss 1.5"
    assert silence.observe(line, 1.0) == line
    assert silence.observe("mpirun noticed that process rank 1 ...", 1.0) is not None
    # a partial line of rank 0 and then rank 1's beat (mpirun tags chunks, not lines)
    assert (
        silence.observe(f"[1,0]<stdout>:Epoch 1[1,1]<stdout>:{BEAT}", 2.0)
        == "[1,0]<stdout>:Epoch 1"
    )
    assert silence.last == {0: 0.0, 1: 2.0}
    # a partial line and the beat read as one chunk: one tag for both, the rank's own
    assert silence.observe(f"[1,0]<stdout>:hello from{BEAT}", 3.0) == "[1,0]<stdout>:hello from"
    assert silence.last[0] == 3.0 and silence.host[0] == "w1"
    # the heartbeat text itself, untagged or from a rank outside the job, is just output
    assert silence.observe(BEAT, 4.0) == BEAT
    assert silence.observe(f"[1,5]<stdout>:{BEAT}", 4.0) == f"[1,5]<stdout>:{BEAT}"


def test_a_silent_rank_is_named_with_its_host_or_expected_host_and_done_is_not_watched() -> None:
    silence = Silence(3, bound_s=10, now=0.0, expected=["h0", "h1", "h2"])
    for rank in range(3):
        silence.observe(f"[1,{rank}]<stdout>:kfp-horovod-heartbeat beat host=pod-{rank} pid=1", 1.0)
    silence.observe("[1,0]<stdout>:kfp-horovod-heartbeat beat host=pod-0 pid=1", 9.0)
    silence.observe("[1,2]<stdout>:kfp-horovod-heartbeat done host=pod-2 pid=1", 9.0)
    assert silence.silent(11.0) == []  # rank 1: 10 s, not more
    assert silence.silent(19.5) == [0, 1]  # rank 2 said done: no longer watched
    assert silence.describe(1, 11.5) == "rank 1 on pod-1 sent no heartbeat for 10 s"
    never = Silence(2, bound_s=5, now=100.0, expected=expected_hosts("w0 slots=1\nw1 slots=1"))
    assert never.silent(105.0) == [] and never.silent(106.0) == [0, 1]  # counted from launch
    assert never.describe(1, 106.0) == (
        "rank 1 (expected on w1 (hostfile)) sent no heartbeat in the 6 s since launch"
    )
    text = "# hostfile\nworker-0.svc slots=2\n\nworker-1.svc slots=2 max_slots=4\nworker-2\n"
    assert expected_hosts(text) == ["worker-0.svc"] * 2 + ["worker-1.svc"] * 2 + ["worker-2"]


def test_a_rank_the_watch_sees_use_cpu_is_not_frozen_however_long_it_is_silent() -> None:
    """A rank on the watch's host (a local job) is silent only while its process uses no CPU:
    busy holding Python's lock, or waiting for a loaded machine's CPU, it is not frozen. The
    watch cannot see another host's process (a cluster's worker): its beats alone count."""
    used = {("here", 11): 1.0, ("here", 12): 1.0}
    silence = Silence(
        3, bound_s=5, now=0.0, expected=[], cpu_seconds=lambda host, pid: used.get((host, pid))
    )
    for rank, host in enumerate(["here", "here", "there"]):
        silence.observe(f"[1,{rank}]<stdout>:{MARK} beat host={host} pid={11 + rank}", 1.0)
    silence.sample(1.0)
    for now in (4.0, 8.0):
        used[("here", 11)] += 0.5  # rank 0 computes; rank 1 is stopped
        silence.sample(now)
    assert silence.silent(8.0) == [1, 2]  # rank 0: silent 7 s, but it ran at 8 s
    assert silence.silent(13.0) == [1, 2] and silence.silent(13.6) == [0, 1, 2]
    assert (
        silence.describe(0, 13.6) == "rank 0 on here sent no heartbeat for 13 s and used no "
        "CPU for 6 s"
    )
    assert silence.describe(2, 13.6) == "rank 2 on there sent no heartbeat for 13 s"


def test_the_heartbeat_beats_until_stopped_then_says_done_once() -> None:
    lines: list[str] = []
    stop = heartbeat.start_from_env({HEARTBEAT_ENV: "0.01"}, lines.append)
    assert stop is not None
    wait_until(lambda: len(lines) >= 3, "3 beats", poll_s=0.01)
    stop()
    stop()
    assert set(lines[:-1]) == {f"kfp-horovod-heartbeat beat host={HOST} pid={os.getpid()}\n"}
    assert lines[-1] == f"kfp-horovod-heartbeat done host={HOST} pid={os.getpid()}\n"


@pytest.mark.parametrize("value", ["abc", "0", "-1", "nan", "inf"])
def test_a_bad_heartbeat_period_is_refused_by_name(value: str) -> None:
    with pytest.raises(ValueError, match="KFP_HOROVOD_HEARTBEAT_SECONDS must be a positive"):
        heartbeat.start_from_env({HEARTBEAT_ENV: value})
    assert heartbeat.start_from_env({}) is None  # not asked: no beat
    assert heartbeat.start_from_env({HEARTBEAT_ENV: " "}) is None


def test_the_trainer_beats_from_its_start_only_when_asked() -> None:
    """It beats before anything else (here its arguments are refused) and says done at exit."""

    def trainer(period: str) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "PYTHONPATH": str(ROOT), HEARTBEAT_ENV: period}
        return subprocess.run(
            [sys.executable, "-m", "components.train.rank"],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
        )

    asked, plain, bad = trainer("0.05"), trainer(""), trainer("soon")
    assert (asked.returncode, plain.returncode, bad.returncode) == (2, 2, 2), asked.stderr
    lines = asked.stdout.splitlines()
    assert lines[0].startswith("kfp-horovod-heartbeat beat host=")
    assert lines[-1].startswith("kfp-horovod-heartbeat done host=")
    assert "kfp-horovod-heartbeat" not in plain.stdout
    assert bad.stderr.splitlines() == [  # one line, before TensorFlow is imported
        "FAILED: KFP_HOROVOD_HEARTBEAT_SECONDS must be a positive number of seconds, got 'soon'"
    ]


def test_the_command_line_refuses_a_missing_command_and_bad_bounds() -> None:
    for argv, message in (
        (["--ranks", "2", "--silence-seconds", "5"], "no command to run"),
        (["--ranks", "0", "--silence-seconds", "5", "--", "true"], "--ranks must be >= 1"),
        (["--ranks", "2", "--silence-seconds", "0", "--", "true"], "--silence-seconds must be"),
    ):
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            assert mpiwatch.main(argv) == 2
        assert message in err.getvalue()


# --- under real mpirun -----------------------------------------------------------------------


def mpirun(*action: str) -> list[str]:
    """2 ranks of `beating_rank.py`, the heartbeat period forwarded as on a cluster."""
    exported = ["-x", "PYTHONPATH", "-x", "PYTHONUNBUFFERED=1", "-x", f"{HEARTBEAT_ENV}=0.25"]
    return [
        "mpirun",
        "-np",
        "2",
        "--tag-output",
        "--oversubscribe",
        "-bind-to",
        "none",
        *exported,
        sys.executable,
        str(RANK_PROGRAM),
        *action,
    ]


def rank_pids(output: str) -> dict[int, int]:
    return {int(r): int(p) for r, p in re.findall(r":rank (\d+) pid (\d+)$", output, re.M)}


def assert_gone(pids: list[int]) -> None:
    """Until every process of `pids` is gone (none is left to a hang)."""
    wait_until(
        lambda: not any(_alive(p) for p in pids),
        lambda: f"end of the rank processes (still running: {[p for p in pids if _alive(p)]})",
    )


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.parametrize(
    ("action", "code"), [("freeze 1", ExitCode.SILENT_RANK), ("sleep 10 3", 3), ("busy 1 6 3", 3)]
)
def test_a_frozen_rank_ends_the_job_in_one_line_else_mpiruns_code_passes(
    action: str, code: int
) -> None:
    """Rank 1 stops itself: named alone, no rank left. Both ranks beat for 2 bounds, then exit
    3: mpirun's code. Rank 1 stops beating but computes for more than the bound: not frozen, the
    job ends with mpirun's code. (The bound leaves time for a loaded machine to start the
    ranks.)"""
    lines: list[str] = []
    env = job_environment({**os.environ, "PYTHONPATH": str(ROOT)})
    got = mpiwatch.watch(mpirun(*action.split()), 2, 5, lines.append, env=env)
    out = "\n".join(lines)
    assert got == code and sorted(rank_pids(out)) == [0, 1], out
    assert "kfp-horovod-heartbeat" not in out
    said = [line for line in out.splitlines() if line.startswith("mpiwatch: ")]
    assert (
        said[0] == "mpiwatch: watching 2 rank(s): one silent (no heartbeat) for more than "
        "5 s ends the job"
    )
    if code == ExitCode.SILENT_RANK:
        assert len(said) == 2 and said[1].startswith(
            f"mpiwatch: the job failed: rank 1 on {HOST} sent no heartbeat for "
        ), out
        assert "and used no CPU for " in said[1]  # the watch sees the local rank's process
        assert "(bound 5 s): frozen, or its node or network is down (mpirun ended " in said[1]
        assert said[1] == out.splitlines()[-1]  # the log ends naming the rank
        assert_gone(list(rank_pids(out).values()))
    else:
        assert said == said[:1]


def test_sigterm_to_the_watch_reaches_mpirun_and_the_ranks() -> None:
    """As the launcher container's PID 1, the watch must pass the kubelet's SIGTERM on."""
    command = [
        sys.executable,
        "-m",
        "components.train.launcher.mpiwatch",
        "--ranks",
        "2",
        "--silence-seconds",
        "60",
        "--",
        *mpirun("sleep", "120", "0"),
    ]
    env = job_environment({**os.environ, "PYTHONPATH": str(ROOT)})
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, env=env)
    assert proc.stdout is not None
    seen = ""
    while len(rank_pids(seen)) < 2:
        line = proc.stdout.readline()
        assert line, f"the watch ended early: {seen}"
        seen += line
    proc.send_signal(signal.SIGTERM)
    rest, _ = proc.communicate(timeout=HANG_S)
    assert proc.returncode != 0, seen + rest
    assert_gone(list(rank_pids(seen).values()))


# --- real Horovod over MPI -------------------------------------------------------------------


@pytest.mark.horovod
def test_a_frozen_rank_of_a_real_job_is_named_and_ends_the_job(
    mnist_1000: str, tmp_path: Path
) -> None:
    """Rank 1 stopped ends the job in one line naming it alone (rank 0, waiting in Horovod's
    collectives, keeps beating), its checkpoint kept, no model exported. The bound is generous:
    importing TensorFlow holds the GIL, so beats pause for seconds."""
    config = TrainConfig(
        data=mnist_1000,
        output=str(tmp_path / "out"),
        workers=2,
        epochs=20,
        batch_size_per_worker=16,
        threads_per_worker=1,
        model="small",
    )
    lines: list[str] = []
    env = {**os.environ, "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": "15"}
    result: list[int] = []
    job = threading.Thread(
        target=lambda: result.append(run_local(config, HANG_S, lines.append, env))
    )
    job.start()
    wait_until(
        lambda: any("checkpoint after epoch 1 " in line for line in lines),
        lambda: "checkpoint after epoch 1 in:\n" + "\n".join(lines),
        alive=job.is_alive,
    )
    os.kill(rank_processes(os.getpid())[1].pid, signal.SIGSTOP)
    join(job, "the job with a frozen rank")
    assert result == [ExitCode.SILENT_RANK], "\n".join(lines)
    (said,) = [line for line in lines if line.startswith("mpiwatch: the job failed: ")]
    assert said.startswith(f"mpiwatch: the job failed: rank 1 on {HOST} sent no heartbeat for ")
    assert "(bound 15 s)" in said and "kfp-horovod-heartbeat" not in "\n".join(lines)
    assert not (tmp_path / "out" / "model").exists()
    assert checkpoints.committed(str(tmp_path / "out" / "checkpoints")) >= 1
