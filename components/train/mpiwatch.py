"""The MPIJob launcher's watch for a frozen rank: mpirun run under a heartbeat check.

``python -m components.train.mpiwatch --ranks N --silence-seconds S -- mpirun ...``

Horovod's stall check cannot end a job whose rank is frozen (SIGSTOP, a hung node, a cut
network): its negotiation is itself a collective that waits on the frozen rank, and the job
would wait until the MPIJob's ``activeDeadlineSeconds``. So every rank beats
(`components.train.heartbeat`: one line every few seconds from its own thread, forwarded by
mpirun's ``--tag-output`` as ``[job,rank]<stdout>:kfp-horovod-heartbeat ...``). This wrapper
runs mpirun, forwards every line of its output except the heartbeats, and tracks each rank's
last beat. When a rank has been silent for longer than S seconds (a rank never heard from
counts from the launch), it prints one line naming the rank and its host (the pod), ends
mpirun (SIGTERM, SIGKILL after a grace) and exits `EXIT_SILENT_RANK`. A rank that wrote its
``done`` line is no longer watched. Otherwise it exits with mpirun's exit code (128 + the
signal if mpirun was killed by one). As the launcher container's PID 1 it forwards SIGTERM and
SIGINT to mpirun (PID 1 has no default action for them).
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import FrameType
from typing import IO

from components.train.heartbeat import MARK

EXIT_SILENT_RANK = 4
TERM_GRACE_SECONDS = 10.0
POLL_SECONDS = 0.5
HOSTFILE_ENV = "OMPI_MCA_orte_default_hostfile"  # mpi-operator sets it on the launcher
# mpirun --tag-output prefixes each chunk it reads from a rank, not each line: a rank's partial
# line and a beat can share a line, and so can two ranks' chunks. A beat is the rank's whose
# tag comes last before it.
_TAG = re.compile(r"\[\d+,(\d+)\]<stdout>:")
_BEAT = re.compile(rf"{re.escape(MARK)} (beat|done) host=(\S+) pid=\d+$")
PREFIX = "mpiwatch:"


@dataclass
class RankState:
    """What the watch knows of one rank: when it was last heard (or the launch), its host."""

    last: float
    host: str | None = None
    heard: bool = False
    done: bool = False


class Silence:
    """The heartbeats of `ranks` ranks, a rank silent past `bound_s` found by `silent`.

    `expected` names each rank's host as the hostfile places it (``-map-by slot``), for a rank
    never heard from.
    """

    def __init__(self, ranks: int, bound_s: float, now: float, expected: list[str]) -> None:
        self.bound_s = bound_s
        self.expected = expected
        self.ranks = {r: RankState(last=now) for r in range(ranks)}

    def observe(self, text: str, now: float) -> str | None:
        """Take one output line; returns what to forward of it (None: it was a heartbeat)."""
        beat = _BEAT.search(text)
        tags = list(_TAG.finditer(text, 0, beat.start())) if beat else []
        if beat is None or not tags or int(tags[-1][1]) not in self.ranks:
            return text
        state = self.ranks[int(tags[-1][1])]
        state.last, state.host, state.heard = now, beat[2], True
        state.done = state.done or beat[1] == "done"
        # What came before the beat on this line (a rank's partial line) is forwarded.
        before = (
            text[: tags[-1].start()] if tags[-1].end() == beat.start() else text[: beat.start()]
        )
        return before or None

    def silent(self, now: float) -> list[int]:
        """The ranks still watched that have been silent for longer than the bound."""
        return [
            r for r, s in sorted(self.ranks.items()) if not s.done and now - s.last > self.bound_s
        ]

    def describe(self, rank: int, now: float) -> str:
        """``rank 1 on <host> sent no heartbeat for 21 s`` (or, never heard: since launch)."""
        state = self.ranks[rank]
        quiet = now - state.last
        if state.heard:
            return f"rank {rank} on {state.host} sent no heartbeat for {quiet:.0f} s"
        where = (
            f"expected on {self.expected[rank]} (hostfile)"
            if rank < len(self.expected)
            else "host unknown"
        )
        return f"rank {rank} ({where}) sent no heartbeat in the {quiet:.0f} s since launch"


def expected_hosts(hostfile: str) -> list[str]:
    """Each rank's host as ``-map-by slot`` fills the hostfile's slots in order."""
    hosts: list[str] = []
    for raw in hostfile.splitlines():
        words = raw.split("#", 1)[0].split()
        if not words:
            continue
        slots = next((w.split("=", 1)[1] for w in words[1:] if w.startswith("slots=")), "1")
        hosts += [words[0]] * (int(slots) if slots.isdigit() else 1)
    return hosts


def _read_hosts(path: str | None) -> list[str]:
    if not path:
        return []
    try:
        with open(path, encoding="utf-8") as f:
            return expected_hosts(f.read())
    except OSError:
        return []


class _Lines:
    """Writes whole lines to `out` from both threads, under its own lock (the ranks' state has
    another: the watch's check never waits on the output)."""

    def __init__(self, out: IO[str]) -> None:
        self.out, self._lock = out, threading.Lock()

    def __call__(self, text: str) -> None:
        with self._lock:
            self.out.write(text + "\n")
            self.out.flush()


def _pump(
    stream: IO[bytes], silence: Silence, lock: threading.Lock, write: Callable[[str], None]
) -> None:
    """Forward mpirun's stdout line by line, heartbeats taken out."""
    for raw in iter(stream.readline, b""):
        text = raw.decode(errors="replace").rstrip("\n")
        with lock:
            forward = silence.observe(text, time.monotonic())
        if forward is not None:
            write(forward)


def _end(proc: subprocess.Popen[bytes], grace_s: float) -> None:
    """SIGTERM mpirun (it tears the job down on the workers); SIGKILL its group after
    `grace_s`."""
    proc.terminate()
    try:
        proc.wait(grace_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def _forward_signals(proc: subprocess.Popen[bytes]) -> Callable[[], None]:
    """Pass SIGTERM and SIGINT on to mpirun; returns what restores the handlers."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None

    def forward(signum: int, frame: FrameType | None) -> None:
        if proc.poll() is None:
            proc.send_signal(signum)

    before = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGINT)}

    def restore() -> None:
        for signum, handler in before.items():
            signal.signal(signum, handler)

    return restore


def exit_code(returncode: int) -> int:
    """mpirun's return code as a process exit code (128 + N for a signal N)."""
    return 128 - returncode if returncode < 0 else returncode


def watch(
    command: Sequence[str],
    ranks: int,
    bound_s: float,
    *,
    hostfile: str | None = None,
    grace_s: float = TERM_GRACE_SECONDS,
    poll_s: float = POLL_SECONDS,
    out: IO[str] = sys.stdout,
) -> int:
    """Run `command` (mpirun) under the watch; returns the exit code (see the module doc)."""
    write = _Lines(out)
    write(
        f"{PREFIX} watching {ranks} rank(s): one silent (no heartbeat) for more than "
        f"{bound_s:g} s ends the job"
    )
    lock = threading.Lock()
    silence = Silence(ranks, bound_s, time.monotonic(), _read_hosts(hostfile))
    proc = subprocess.Popen(list(command), stdout=subprocess.PIPE, start_new_session=True)
    restore = _forward_signals(proc)
    assert proc.stdout is not None
    reader = threading.Thread(target=_pump, args=(proc.stdout, silence, lock, write), daemon=True)
    reader.start()
    try:
        verdict = _wait(proc, silence, lock, poll_s)
        if verdict is None:
            reader.join(grace_s)
            return exit_code(int(proc.returncode))
        write(f"{PREFIX} {verdict}; ending the job")
        ending = time.monotonic()
        _end(proc, grace_s)
        code = exit_code(proc.returncode)
        ended = f"mpirun ended {time.monotonic() - ending:.1f} s later, exit {code}"
        reader.join(grace_s)  # ssh children may hold the pipe open after mpirun is gone
        write(f"{PREFIX} the job failed: {verdict} ({ended})")
        return EXIT_SILENT_RANK
    finally:
        restore()


def _wait(
    proc: subprocess.Popen[bytes], silence: Silence, lock: threading.Lock, poll_s: float
) -> str | None:
    """Wait for mpirun to end (None) or for a rank to fall silent (what to say about it)."""
    while True:
        try:
            proc.wait(poll_s)
            return None
        except subprocess.TimeoutExpired:
            pass
        now = time.monotonic()
        with lock:
            quiet = silence.silent(now)
            if quiet:
                names = "; ".join(silence.describe(r, now) for r in quiet)
                return (
                    f"{names} (bound {silence.bound_s:g} s): frozen, or its node or network is down"
                )


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m components.train.mpiwatch",
        description="Run mpirun; end the job when a rank's heartbeats stop.",
    )
    parser.add_argument("--ranks", type=int, required=True, help="the job's number of ranks")
    parser.add_argument(
        "--silence-seconds", type=float, required=True,
        help="end the job when a rank has sent no heartbeat for this long",
    )  # fmt: skip
    parser.add_argument(
        "--hostfile", default=None,
        help=f"where to look up the host of a rank never heard from (default: ${HOSTFILE_ENV})",
    )  # fmt: skip
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- mpirun ...")
    args = parser.parse_args(argv)
    if args.command[:1] == ["--"]:
        args.command = args.command[1:]
    if not args.command:
        parser.error("no command to run: give it after --, e.g. -- mpirun -np 2 ...")
    if args.ranks < 1:
        parser.error(f"--ranks must be >= 1, got {args.ranks}")
    if not args.silence_seconds > 0:
        parser.error(f"--silence-seconds must be > 0, got {args.silence_seconds:g}")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    hostfile = args.hostfile or os.environ.get(HOSTFILE_ENV)
    return watch(args.command, args.ranks, args.silence_seconds, hostfile=hostfile)


if __name__ == "__main__":
    sys.exit(main())
