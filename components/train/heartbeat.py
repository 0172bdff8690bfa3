"""A rank's heartbeat under mpirun: one line on stdout every few seconds, while it lives.

The MPIJob's launcher runs mpirun under `components.train.mpiwatch`, which reads the ranks'
output (mpirun forwards it, tagged ``[job,rank]<stdout>:``) and ends the job when a rank has
been silent for longer than its bound. A frozen rank (SIGSTOP, a hung node, a cut network)
stops beating; a rank merely waiting in an allreduce keeps beating, because the beat comes
from its own thread.

The beat starts when the rank's program starts (`start_from_env`, called first thing by
``python -m components.train``), before TensorFlow and Horovod are imported: that import takes
seconds, and a beat started only after ``hvd.init()`` would leave it uncovered. It is on only
where the launcher asks for it: ``mpirun -x`` forwards `HEARTBEAT_ENV` (the period in
seconds), read when the program starts, never at import. The last line, ``done``, is written
at interpreter exit after Horovod's own exit handler (registered later, so run earlier) has
shut Horovod down: a rank that finished its part is then no longer watched.
"""

from __future__ import annotations

import atexit
import math
import os
import socket
import threading
from collections.abc import Callable, Mapping

from components.common.defaults import HEARTBEAT_SECONDS

HEARTBEAT_ENV = "KFP_HOROVOD_HEARTBEAT_SECONDS"
MARK = "kfp-horovod-heartbeat"
BEATS_PER_BOUND = 4  # a rank is declared silent only after this many periods without a beat


def period_for(bound_s: float) -> float:
    """The heartbeat period for a silence bound of `bound_s`: `HEARTBEAT_SECONDS`, or less
    so that `BEATS_PER_BOUND` beats fit in the bound."""
    return min(float(HEARTBEAT_SECONDS), bound_s / BEATS_PER_BOUND)


def line(state: str, host: str, pid: int) -> str:
    """One heartbeat line: ``kfp-horovod-heartbeat <beat|done> host=<host> pid=<pid>``."""
    return f"{MARK} {state} host={host} pid={pid}\n"


def _write_stdout(text: str) -> None:
    os.write(1, text.encode())  # one write(2) of one short line: never split by other output


class Heartbeat:
    """Writes `line` ``beat`` every `period_s` from a daemon thread; `stop` writes ``done``."""

    def __init__(self, period_s: float, write: Callable[[str], None] = _write_stdout) -> None:
        self.period_s, self.write = period_s, write
        self.host, self.pid = socket.gethostname(), os.getpid()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True, name="heartbeat")

    def start(self) -> Heartbeat:
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop beating and say ``done`` (once)."""
        if self._stop.is_set():
            return
        self._stop.set()
        self._thread.join()
        self.write(line("done", self.host, self.pid))

    def _loop(self) -> None:
        while True:
            self.write(line("beat", self.host, self.pid))
            if self._stop.wait(self.period_s):
                return


def period_from_env(environ: Mapping[str, str]) -> float | None:
    """The period `HEARTBEAT_ENV` asks for, or None when it is unset or empty.

    Raises ValueError naming the variable if it is not a positive number of seconds.
    """
    value = environ.get(HEARTBEAT_ENV, "").strip()
    if not value:
        return None
    try:
        period = float(value)
    except ValueError:
        period = math.nan
    if not (math.isfinite(period) and period > 0):
        raise ValueError(f"{HEARTBEAT_ENV} must be a positive number of seconds, got {value!r}")
    return period


def start_from_env(environ: Mapping[str, str] | None = None) -> Heartbeat | None:
    """Start this process's heartbeat if `HEARTBEAT_ENV` is set (the launcher's mpiwatch asks
    for it); its ``done`` line is written at exit. Returns it, or None when not asked for."""
    period = period_from_env(os.environ if environ is None else environ)
    if period is None:
        return None
    beat = Heartbeat(period).start()
    atexit.register(beat.stop)
    return beat
