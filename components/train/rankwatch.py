"""The local launcher's watch for a frozen rank: named at once, the job ended within a bound.

Horovod's stall check does not catch a rank that is frozen (stopped by SIGSTOP, or a process
that no longer runs at all): the check runs on the coordinator between negotiation rounds, and
each round is itself a collective that waits on the frozen rank. What ends such a job is Gloo's
own timeout (``HOROVOD_GLOO_TIMEOUT_SECONDS``, 30 s), whose message, "Application timeout
caused pair closure", names no rank, and horovodrun's teardown after it (bench/faults/
measured this). So `run_local` watches its rank processes: a rank found stopped is named in the
job's output at once, and if it is still stopped after the stall-shutdown time the job's
environment sets (``HOROVOD_STALL_SHUTDOWN_TIME_SECONDS``), the watch says so and kills that
rank; the others fail on the lost connection and horovodrun fails the job, as for a crash. A
rank stopped by a debugger (tracing stop) is left alone. Under mpirun (a static local job) the
same kill ends the job: mpirun stops every rank when one dies. The MPIJob's ranks run in other
pods, whose processes the launcher cannot see: it watches their heartbeats instead
(`components.train.mpiwatch`).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable

import psutil

# Where a rank process's rank is: mpirun sets OMPI_COMM_WORLD_RANK, horovodrun HOROVOD_RANK.
RANK_ENVS = ("OMPI_COMM_WORLD_RANK", "HOROVOD_RANK")
POLL_SECONDS = 0.5


def rank_processes(root_pid: int) -> dict[int, psutil.Process]:
    """The rank processes below `root_pid` by rank: the innermost process carrying the rank's
    ``OMPI_COMM_WORLD_RANK`` (mpirun) or ``HOROVOD_RANK`` (horovodrun starts each through a
    shell)."""
    found: dict[int, list[psutil.Process]] = {}
    try:
        children = psutil.Process(root_pid).children(recursive=True)
    except psutil.Error:
        return {}
    for proc in children:
        try:
            env = proc.environ()
            rank = next((env[name] for name in RANK_ENVS if name in env), None)
        except psutil.Error:
            continue
        if rank is not None and rank.isdigit():
            found.setdefault(int(rank), []).append(proc)
    out = {}
    for rank, procs in found.items():
        pids = {p.pid for p in procs}
        inner = [p for p in procs if not pids & {c.pid for c in _children(p)}]
        if inner:
            out[rank] = inner[0]
    return out


def _children(proc: psutil.Process) -> list[psutil.Process]:
    try:
        return list(proc.children(recursive=True))
    except psutil.Error:
        return []


def _stopped(proc: psutil.Process) -> bool:
    try:
        return bool(proc.status() == psutil.STATUS_STOPPED)
    except psutil.Error:
        return False


class RankWatch:
    """Polls the ranks below `root_pid` from a thread (`start`, `stop`); see the module doc."""

    def __init__(self, root_pid: int, bound_s: float, log: Callable[[str], None]) -> None:
        self.root_pid, self.bound_s, self.log = root_pid, bound_s, log
        self.ended_by: int | None = None  # the rank whose freeze ended the job
        self._since: dict[int, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True, name="rank-watch")

    def start(self) -> RankWatch:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def _loop(self) -> None:
        while not self._stop.wait(POLL_SECONDS) and self.ended_by is None:
            self.poll(time.monotonic())

    def poll(self, now: float) -> None:
        """One look at the ranks: name a newly stopped one; end the job if one stayed stopped."""
        ranks = rank_processes(self.root_pid)
        for rank, proc in sorted(ranks.items()):
            if not _stopped(proc):
                self._since.pop(rank, None)
                continue
            if rank not in self._since:
                self._since[rank] = now
                self.log(
                    f"launcher: rank {rank} (pid {proc.pid}) is stopped and the other ranks wait "
                    f"for it; the job ends if it is still stopped in {self.bound_s:g} s"
                )
            elif now - self._since[rank] >= self.bound_s:
                self.log(
                    f"launcher: rank {rank} (pid {proc.pid}) has been stopped for "
                    f"{now - self._since[rank]:.0f} s (stall bound {self.bound_s:g} s): "
                    "ending the job"
                )
                self.ended_by = rank
                with contextlib.suppress(psutil.Error):
                    proc.kill()  # the others then fail on the lost connection, as for a crash
                return
