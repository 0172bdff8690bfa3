"""The one watch of a static Horovod job: mpirun run under its ranks' heartbeats. Runs in the
launcher: ``python -m components.train.launcher.mpiwatch --ranks N --silence-seconds S -- mpirun
...`` on a cluster job's launcher, `watch` in process for a local job
(`components.train.launcher.launch.run_local`).
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import click

from components.common.declare import run_command
from components.common.failure import (
    SIGNAL_BASE,
    ExitCode,
    InputError,
    Stopped,
    one_line_failures,
    stops_on_signals,
)
from components.common.processes import Started
from components.train.rank.heartbeat import MARK

# Horovod's stall check cannot end a job whose rank is frozen (SIGSTOP, a hung node, a cut network):
# its negotiation is itself a collective that waits on that rank, and the transports' timeouts name
# no rank (bench/faults/). So every rank beats from its own thread
# (`components.train.rank.heartbeat`), mpirun's ``--tag-output`` forwards each beat, and the watch
# takes the beats out of mpirun's output. A rank silent for over S seconds (counted from the launch
# if never heard; ``done``: no longer watched; a rank on the watch's own host, as in a local job,
# only while its process uses no CPU: one that a loaded machine delays, or that holds Python's lock
# in TensorFlow's import, is not frozen) ends mpirun (SIGTERM, then SIGKILL to everything below it),
# one last line names the rank and its host, and the exit code is `ExitCode.SILENT_RANK`; otherwise
# it is mpirun's (`SIGNAL_BASE` + N for a signal N). A stop (SIGTERM, Ctrl-C: `Stopped`) kills
# mpirun and every process below it at once, and says so.
TERM_GRACE_SECONDS = 10.0
POLL_SECONDS = 0.5
HOSTFILE_ENV = "OMPI_MCA_orte_default_hostfile"  # mpi-operator sets it on the launcher
PREFIX = "mpiwatch:"
# mpirun --tag-output prefixes each chunk it reads from a rank, not each line: a rank's partial
# line and a beat can share a line, and so can two ranks' chunks. A beat is the rank's whose
# tag comes last before it. Elastic horovodrun tags ``[rank]<stdout>:``.
_TAG = re.compile(r"\[\d+,(\d+)\]<stdout>:")
_BEAT = re.compile(rf"{re.escape(MARK)} (beat|done) host=(\S+) pid=(\d+)$")


def local_cpu_seconds(host: str, pid: int) -> float | None:
    """The CPU seconds process `pid` has used if it runs on this host (a local job's rank);
    None for another host's (a cluster's worker) or a process gone."""
    import psutil

    if host != socket.gethostname():
        return None
    try:
        used = psutil.Process(pid).cpu_times()
    except psutil.Error:
        return None
    return float(used.user + used.system)


class Silence:
    """The heartbeats of `ranks` ranks; `expected`: each rank's host per the hostfile.
    `cpu_seconds(host, pid)`: what a rank's process has used, where the watch can see it."""

    def __init__(
        self,
        ranks: int,
        bound_s: float,
        now: float,
        expected: list[str],
        cpu_seconds: Callable[[str, int], float | None] = local_cpu_seconds,
    ) -> None:
        self.bound_s, self.expected, self.cpu_seconds = bound_s, expected, cpu_seconds
        self.last = dict.fromkeys(range(ranks), now)  # when each was last heard, or the launch
        self.host: dict[int, str] = {}
        self.pid: dict[int, int] = {}
        self.cpu: dict[int, float] = {}  # each visible rank's CPU seconds at the last sample
        self.ran: dict[int, float] = {}  # when a visible rank was last seen using CPU
        self.done: set[int] = set()

    def observe(self, text: str, now: float) -> str | None:
        """Take one output line; returns what to forward of it (None: it was a heartbeat)."""
        beat = _BEAT.search(text)
        tags = list(_TAG.finditer(text, 0, beat.start())) if beat else []
        if beat is None or not tags or int(tags[-1][1]) not in self.last:
            return text
        rank = int(tags[-1][1])
        self.last[rank], self.host[rank], self.pid[rank] = now, beat[2], int(beat[3])
        if beat[1] == "done":
            self.done.add(rank)
        # What came before the beat on this line (a rank's partial line) is forwarded.
        end = tags[-1].start() if tags[-1].end() == beat.start() else beat.start()
        return text[:end] or None

    def sample(self, now: float) -> None:
        """Note, at `now`, each rank whose process the watch sees using CPU since the last
        sample: it runs (busy, or waiting for a loaded machine's CPU), so it is not frozen."""
        for rank, pid in self.pid.items():
            used = None if rank in self.done else self.cpu_seconds(self.host[rank], pid)
            if used is None:
                continue
            if used > self.cpu.get(rank, used):
                self.ran[rank] = now
            self.cpu[rank] = used

    def quiet_for(self, rank: int, now: float) -> float:
        """Since when `rank` has neither beaten nor (where the watch sees it) used CPU."""
        return now - max(self.last[rank], self.ran.get(rank, -math.inf))

    def silent(self, now: float) -> list[int]:
        quiet = [r for r in sorted(self.last) if self.quiet_for(r, now) > self.bound_s]
        return [r for r in quiet if r not in self.done]

    def verdict(self, now: float) -> str | None:
        """What to say about the ranks fallen silent, or None."""
        if not (quiet := self.silent(now)):
            return None
        names = "; ".join(self.describe(r, now) for r in quiet)
        return f"{names} (bound {self.bound_s:g} s): frozen, or its node or network is down"

    def describe(self, rank: int, now: float) -> str:
        quiet = now - self.last[rank]
        if rank in self.host:
            said = f"rank {rank} on {self.host[rank]} sent no heartbeat for {quiet:.0f} s"
            if rank in self.cpu:  # its process is on this host
                said += f" and used no CPU for {self.quiet_for(rank, now):.0f} s"
            return said
        known = rank < len(self.expected)
        where = f"expected on {self.expected[rank]} (hostfile)" if known else "host unknown"
        return f"rank {rank} ({where}) sent no heartbeat in the {quiet:.0f} s since launch"


def expected_hosts(hostfile: str) -> list[str]:
    """Each rank's host as ``-map-by slot`` fills the hostfile's slots in order."""
    hosts: list[str] = []
    for raw in hostfile.splitlines():
        words = raw.split("#", 1)[0].split()
        if words:
            slots = next((w.split("=", 1)[1] for w in words[1:] if w.startswith("slots=")), "1")
            hosts += [words[0]] * (int(slots) if slots.isdigit() else 1)
    return hosts


def kill_job(pid: int) -> None:
    """SIGKILL `pid` and every process below it (mpirun gives each rank its own group)."""
    import psutil

    with contextlib.suppress(psutil.NoSuchProcess):
        root = psutil.Process(pid)
        for proc in [root, *root.children(recursive=True)]:
            with contextlib.suppress(psutil.NoSuchProcess):
                proc.kill()


def watch(
    command: Sequence[str],
    ranks: int,
    bound_s: float,
    log: Callable[[str], None] = print,
    *,
    env: Mapping[str, str] | None = None,
    expected: Sequence[str] = (),
    timeout_s: float | None = None,
) -> int:
    """Run `command` (mpirun) watching `ranks` ranks (0: none), its output to `log`; returns
    the exit code. Past `timeout_s` the job is killed and TimeoutError raised."""
    lock = threading.Lock()  # one line at a time to `log`, from the reader and from here
    silence = Silence(ranks, bound_s, time.monotonic(), list(expected))
    try:
        proc = subprocess.Popen(
            list(command),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=None if env is None else dict(env),
            start_new_session=True,
        )
    except OSError as exc:  # no such program, not executable
        raise InputError(f"cannot run {command[0]}: {exc.strerror or exc}") from None
    if ranks:
        said = f"one silent (no heartbeat) for more than {bound_s:g} s ends the job"
        log(f"{PREFIX} watching {ranks} rank(s): {said}")

    def pump() -> None:  # mpirun's output, heartbeats taken out
        assert proc.stdout is not None
        for raw in iter(proc.stdout.readline, b""):
            with lock:
                line = silence.observe(raw.decode(errors="replace").rstrip("\n"), time.monotonic())
                if line is not None:
                    log(line)

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    deadline = math.inf if timeout_s is None else time.monotonic() + timeout_s
    verdict = None
    try:
        while verdict is None and _running(proc):
            if time.monotonic() > deadline:
                raise TimeoutError(f"the job did not finish within {timeout_s:g} s and was killed")
            with lock:
                silence.sample(time.monotonic())
                verdict = silence.verdict(time.monotonic())
        if verdict is not None:
            ending = time.monotonic()
            proc.terminate()  # mpirun tears the job down, on other hosts too
            _running(proc, TERM_GRACE_SECONDS)
    except Stopped as stop:  # SIGTERM or Ctrl-C: the job ends at once, all of it
        below = Started.of(proc.pid)  # noted first: a killed parent's children are reparented
        kill_job(proc.pid)
        proc.wait()
        label = (
            "horovodrun" if "components.train.launcher.launch" in command else Path(command[0]).name
        )
        stop.ended.append(
            f"ended the Horovod job: {label} (pid {proc.pid}) and the {below.describe()} below it"
        )
        raise
    finally:
        if proc.poll() is None:  # after a timeout, an interrupt, an error, or the grace
            kill_job(proc.pid)
            proc.wait()
        reader.join(TERM_GRACE_SECONDS)  # ssh children may hold the pipe open after mpirun ends
    code = SIGNAL_BASE - proc.returncode if proc.returncode < 0 else proc.returncode
    if verdict is None:
        return code
    with lock:  # the last line: a failed job's log ends naming the rank
        ended = f"mpirun ended {time.monotonic() - ending:.1f} s later, exit {code}"
        log(f"{PREFIX} the job failed: {verdict} ({ended})")
    return ExitCode.SILENT_RANK


def _running(proc: subprocess.Popen[bytes], seconds: float = POLL_SECONDS) -> bool:
    """Whether `proc` still runs after waiting up to `seconds` for it."""
    try:
        proc.wait(seconds)
    except subprocess.TimeoutExpired:
        return True
    return False


@click.command(
    help="Run mpirun; end the job when a rank's heartbeats stop.",
    context_settings={"ignore_unknown_options": True},
)
@click.option("--ranks", type=int, required=True, help="the job's number of ranks")
@click.option(
    "--silence-seconds",
    type=float,
    required=True,
    help="end the job when a rank has sent no heartbeat for this long",
)
@click.argument("command", nargs=-1, type=click.UNPROCESSED, metavar="-- MPIRUN...")
def command(ranks: int, silence_seconds: float, command: tuple[str, ...]) -> int:
    """As a launcher container's PID 1 it has no default action on SIGTERM: SIGTERM and Ctrl-C
    end the job (the watch kills mpirun and every process below it) in one ``STOPPED:`` line,
    exit 128 + N; a command that cannot run is one ``FAILED:`` line."""
    command = command[1:] if command[:1] == ("--",) else command
    if not command:
        raise click.UsageError("no command to run: give it after --, e.g. -- mpirun -np 2 ...")
    if ranks < 1:
        raise click.UsageError(f"--ranks must be >= 1, got {ranks}")
    if not silence_seconds > 0:
        raise click.UsageError(f"--silence-seconds must be > 0, got {silence_seconds:g}")
    hostfile = Path(os.environ.get(HOSTFILE_ENV) or "/nonexistent")
    expected = expected_hosts(hostfile.read_text()) if hostfile.is_file() else []
    log = functools.partial(print, flush=True)
    with one_line_failures(), stops_on_signals():
        return watch(list(command), ranks, silence_seconds, log, expected=expected)


def main(argv: Sequence[str] | None = None) -> int:
    """The command line; returns the exit code."""
    return int(run_command(command, argv, "python -m components.train.launcher.mpiwatch"))


if __name__ == "__main__":
    sys.exit(main())
