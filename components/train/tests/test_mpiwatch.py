"""The MPIJob launcher's heartbeat watch (mpiwatch) and the ranks' heartbeat.

The process tests run the real ``mpirun`` (Open MPI, which `make install` installs) with 2
ranks of `beating_rank.py`, a small program that beats as the trainer's ranks do; the Horovod
ones run real Horovod over MPI in it. `Silence` is also tested on its own with lines as
mpirun's ``--tag-output`` writes them (seen in the real runs below).
"""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from components.train import heartbeat, mpiwatch
from components.train.mpiwatch import EXIT_SILENT_RANK, Silence, expected_hosts

RANK_PROGRAM = Path(__file__).with_name("beating_rank.py")
ROOT = Path(__file__).resolve().parents[3]
BEAT = "kfp-horovod-heartbeat beat host=w1 pid=7"


def test_heartbeats_are_taken_out_and_the_rest_forwarded() -> None:
    silence = Silence(2, bound_s=10, now=0.0, expected=[])
    assert silence.observe(f"[1,1]<stdout>:{BEAT}", now=1.0) is None
    assert silence.observe("[1,0]<stdout>:[rank 0/2] Epoch 1/2 - loss 1.5", 1.0) == (
        "[1,0]<stdout>:[rank 0/2] Epoch 1/2 - loss 1.5"
    )
    assert silence.observe("mpirun noticed that process rank 1 ...", 1.0) is not None
    # a partial line of rank 0 and then rank 1's beat (mpirun tags chunks, not lines)
    assert silence.observe(f"[1,0]<stdout>:Epoch 1[1,1]<stdout>:{BEAT}", 2.0) == (
        "[1,0]<stdout>:Epoch 1"
    )
    assert silence.ranks[1].last == 2.0 and silence.ranks[0].last == 0.0
    # a partial line and the beat read as one chunk: one tag for both, the rank's own
    assert silence.observe(f"[1,0]<stdout>:hello from{BEAT}", 3.0) == "[1,0]<stdout>:hello from"
    assert silence.ranks[0].last == 3.0 and silence.ranks[0].host == "w1"
    # the heartbeat text itself, untagged or from a rank outside the job, is just output
    assert silence.observe(BEAT, 4.0) == BEAT
    assert silence.observe(f"[1,5]<stdout>:{BEAT}", 4.0) == f"[1,5]<stdout>:{BEAT}"


def test_a_rank_silent_past_the_bound_is_named_with_its_host() -> None:
    silence = Silence(3, bound_s=10, now=0.0, expected=["h0", "h1", "h2"])
    for rank in range(3):
        silence.observe(f"[1,{rank}]<stdout>:kfp-horovod-heartbeat beat host=pod-{rank} pid=1", 1.0)
    silence.observe("[1,0]<stdout>:kfp-horovod-heartbeat beat host=pod-0 pid=1", 9.0)
    silence.observe("[1,2]<stdout>:kfp-horovod-heartbeat beat host=pod-2 pid=1", 9.0)
    assert silence.silent(11.0) == []  # rank 1: 10 s, not more
    assert silence.silent(11.5) == [1]
    assert silence.describe(1, 11.5) == "rank 1 on pod-1 sent no heartbeat for 10 s"


def test_a_rank_never_heard_from_counts_from_launch_and_a_done_rank_is_not_watched() -> None:
    silence = Silence(2, bound_s=5, now=100.0, expected=expected_hosts("w0 slots=1\nw1 slots=1"))
    silence.observe("[1,0]<stdout>:kfp-horovod-heartbeat done host=w0 pid=1", 101.0)
    assert silence.silent(105.0) == []
    assert silence.silent(106.0) == [1]  # rank 0 said done: only rank 1 is silent
    assert silence.describe(1, 106.0) == (
        "rank 1 (expected on w1 (hostfile)) sent no heartbeat in the 6 s since launch"
    )


def test_expected_hosts_fill_each_host_s_slots_in_order() -> None:
    text = "# hostfile\nworker-0.svc slots=2\n\nworker-1.svc slots=2 max_slots=4\nworker-2\n"
    assert expected_hosts(text) == [
        "worker-0.svc", "worker-0.svc", "worker-1.svc", "worker-1.svc", "worker-2",
    ]  # fmt: skip


def test_the_heartbeat_beats_until_stopped_then_says_done_once() -> None:
    lines: list[str] = []
    beat = heartbeat.Heartbeat(0.01, write=lines.append).start()
    deadline = time.monotonic() + 10
    while len(lines) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    beat.stop()
    beat.stop()
    host, pid = socket.gethostname(), os.getpid()
    assert len(lines) >= 4
    assert set(lines[:-1]) == {f"kfp-horovod-heartbeat beat host={host} pid={pid}\n"}
    assert lines[-1] == f"kfp-horovod-heartbeat done host={host} pid={pid}\n"


@pytest.mark.parametrize("value", ["abc", "0", "-1", "nan", "inf"])
def test_a_bad_heartbeat_period_is_refused_by_name(value: str) -> None:
    with pytest.raises(ValueError, match="KFP_HOROVOD_HEARTBEAT_SECONDS must be a positive"):
        heartbeat.period_from_env({heartbeat.HEARTBEAT_ENV: value})
    assert heartbeat.period_from_env({}) is None
    assert heartbeat.period_from_env({heartbeat.HEARTBEAT_ENV: " "}) is None


def test_the_trainer_beats_from_its_start_only_when_asked(tmp_path: Path) -> None:
    """``python -m components.train`` beats before anything else (here its arguments are
    refused, exit 2), and says done at exit; without the variable it writes no beat."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), heartbeat.HEARTBEAT_ENV: "0.05"}
    asked = subprocess.run(
        [sys.executable, "-m", "components.train"], capture_output=True, text=True, env=env,
        timeout=120,
    )  # fmt: skip
    assert asked.returncode == 2, asked.stderr
    lines = asked.stdout.splitlines()
    assert lines[0].startswith("kfp-horovod-heartbeat beat host=") and lines[-1].startswith(
        "kfp-horovod-heartbeat done host="
    )
    env.pop(heartbeat.HEARTBEAT_ENV)
    plain = subprocess.run(
        [sys.executable, "-m", "components.train"], capture_output=True, text=True, env=env,
        timeout=120,
    )  # fmt: skip
    assert plain.returncode == 2 and "kfp-horovod-heartbeat" not in plain.stdout
    env[heartbeat.HEARTBEAT_ENV] = "soon"
    bad = subprocess.run(
        [sys.executable, "-m", "components.train"], capture_output=True, text=True, env=env,
        timeout=120,
    )  # fmt: skip
    assert bad.returncode == 1
    assert "KFP_HOROVOD_HEARTBEAT_SECONDS must be a positive number of seconds, got 'soon'" in (
        bad.stderr
    )


# --- under real mpirun -----------------------------------------------------------------------


def mpirun(*action: str, period: float | None = 0.25, hostfile: Path | None = None) -> list[str]:
    """``mpirun -np 2 --tag-output ... python beating_rank.py ACTION`` on this machine."""
    assert shutil.which("mpirun"), "mpirun is missing: `make install` installs Open MPI"
    exported = ["-x", "PYTHONPATH", "-x", "PYTHONUNBUFFERED=1", "-x", "TF_CPP_MIN_LOG_LEVEL=3"]
    if period is not None:
        exported += ["-x", f"{heartbeat.HEARTBEAT_ENV}={period:g}"]
    hosts = ["--hostfile", str(hostfile)] if hostfile else ["--oversubscribe"]
    return [
        "mpirun", "-np", "2", "--tag-output", *hosts, "-bind-to", "none", *exported,
        sys.executable, str(RANK_PROGRAM), *action,
    ]  # fmt: skip


@pytest.fixture(autouse=True)
def mpirun_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """What mpirun needs here: the project on PYTHONPATH; as root, Open MPI's consent."""
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    if os.geteuid() == 0:
        monkeypatch.setenv("OMPI_ALLOW_RUN_AS_ROOT", "1")
        monkeypatch.setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")


def run_watch(command: list[str], bound_s: float, **kw: Any) -> tuple[int, str]:
    out = io.StringIO()
    code = mpiwatch.watch(command, 2, bound_s, grace_s=10, poll_s=0.1, out=out, **kw)
    return code, out.getvalue()


def rank_pids(output: str) -> dict[int, int]:
    """``{rank: pid}`` from the ``rank <r> pid <pid>`` lines of `beating_rank.py`."""
    found = {}
    for line in output.splitlines():
        words = line.split(":", 1)[-1].split()
        if len(words) == 4 and words[0] == "rank" and words[2] == "pid":
            found[int(words[1])] = int(words[3])
    return found


def assert_gone(pids: list[int], timeout: float = 30) -> None:
    """Every one of `pids` ends (mpirun's teardown, or the watch's SIGKILL, reached it)."""
    deadline = time.monotonic() + timeout
    alive = list(pids)
    while alive and time.monotonic() < deadline:
        alive = [p for p in alive if _alive(p)]
        time.sleep(0.1)
    assert not alive, f"rank processes still running: {alive}"


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_a_frozen_rank_ends_the_job_named_and_nonzero() -> None:
    code, out = run_watch(mpirun("freeze", "1"), bound_s=2)
    assert code == EXIT_SILENT_RANK, out
    named = [line for line in out.splitlines() if line.startswith("mpiwatch: rank 1 on ")]
    assert named and named[0].startswith(f"mpiwatch: rank 1 on {socket.gethostname()} sent no ")
    assert "ending the job" in named[0]
    last = out.splitlines()[-1]
    assert last.startswith(f"mpiwatch: the job failed: rank 1 on {socket.gethostname()} "), out
    assert "rank 0" not in "\n".join(named)  # rank 0 kept beating
    assert "kfp-horovod-heartbeat" not in out
    pids = rank_pids(out)
    assert sorted(pids) == [0, 1], out
    assert_gone(list(pids.values()))


def test_a_normal_end_passes_mpirun_s_exit_code_through_without_heartbeats() -> None:
    code, out = run_watch(mpirun("exit", "3"), bound_s=5)
    assert code == 3, out
    assert sorted(rank_pids(out)) == [0, 1] and "kfp-horovod-heartbeat" not in out
    code, out = run_watch(mpirun("sleep", "3"), bound_s=1)  # 3 x the bound, beating all along
    assert code == 0, out
    assert sorted(rank_pids(out)) == [0, 1] and "kfp-horovod-heartbeat" not in out
    assert "mpiwatch: rank" not in out


def test_ranks_that_never_beat_are_named_by_their_hostfile_hosts(tmp_path: Path) -> None:
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("localhost slots=2\n")
    command = mpirun("sleep", "60", period=None, hostfile=hostfile)
    code, out = run_watch(command, bound_s=2, hostfile=str(hostfile))
    assert code == EXIT_SILENT_RANK, out
    named = next(line for line in out.splitlines() if line.startswith("mpiwatch: rank 0 "))
    assert named.startswith(
        "mpiwatch: rank 0 (expected on localhost (hostfile)) sent no heartbeat in the 2 s since "
        "launch; rank 1 (expected on localhost (hostfile)) sent no heartbeat in the"
    ), named
    assert_gone(list(rank_pids(out).values()))


def test_sigterm_to_the_watch_reaches_mpirun_and_the_ranks() -> None:
    """As the launcher container's PID 1, the watch must pass the kubelet's SIGTERM on."""
    command = [sys.executable, "-m", "components.train.mpiwatch", "--ranks", "2",
               "--silence-seconds", "60", "--", *mpirun("sleep", "120")]  # fmt: skip
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    seen = ""
    while len(rank_pids(seen)) < 2:
        line = proc.stdout.readline()
        assert line, f"the watch ended early: {seen}"
        seen += line
    proc.send_signal(signal.SIGTERM)
    rest, _ = proc.communicate(timeout=60)
    assert proc.returncode != 0, seen + rest
    assert_gone(list(rank_pids(seen).values()))


def test_the_command_line_refuses_a_missing_command_and_bad_bounds() -> None:
    for argv, message in (
        (["--ranks", "2", "--silence-seconds", "5"], "no command to run"),
        (["--ranks", "0", "--silence-seconds", "5", "--", "true"], "--ranks must be >= 1"),
        (["--ranks", "2", "--silence-seconds", "0", "--", "true"], "--silence-seconds must be"),
    ):
        err = io.StringIO()
        with pytest.raises(SystemExit) as exited, contextlib.redirect_stderr(err):
            mpiwatch.parse_args(argv)
        assert exited.value.code == 2 and message in err.getvalue()


# --- real Horovod over MPI -------------------------------------------------------------------


@pytest.mark.horovod
def test_a_rank_waiting_in_an_allreduce_keeps_beating() -> None:
    """Rank 0 waits in Horovod's allreduce for 3 bounds while rank 1 sleeps: not ended."""
    code, out = run_watch(mpirun("allreduce-wait", "12"), bound_s=4)
    assert code == 0, out
    assert "rank 0 allreduce done: 2" in out and "mpiwatch: rank" not in out


@pytest.mark.horovod
def test_a_rank_frozen_before_an_allreduce_is_named_and_the_job_ended() -> None:
    """Rank 1 stops itself while rank 0 waits in Horovod's allreduce (whose stall check
    cannot fire): the watch names rank 1 and ends the job; no rank is left."""
    code, out = run_watch(mpirun("allreduce-freeze"), bound_s=4)
    assert code == EXIT_SILENT_RANK, out
    named = out.index(f"mpiwatch: rank 1 on {socket.gethostname()} sent no heartbeat for")
    assert "rank 0 joined a Horovod job of 2" in out[:named]
    # Rank 0 was stuck until the watch spoke (mpirun's teardown sends SIGCONT before SIGTERM,
    # so the stopped rank can wake and finish the allreduce while it is being ended).
    assert "allreduce done" not in out[:named], out
    assert_gone(list(rank_pids(out).values()))
