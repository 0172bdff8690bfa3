"""Each rank's heartbeat, the rank's half of the launcher's watch
(`components.train.launcher.mpiwatch`): a line every period from a daemon thread of each rank,
started first thing in ``python -m components.train.rank`` when the launcher sets
`HEARTBEAT_ENV`.
"""

from __future__ import annotations

import atexit
import math
import os
import socket
import threading
from collections.abc import Callable, Mapping

from components.common.defaults import HEARTBEAT_SECONDS
from components.common.failure import InputError

HEARTBEAT_ENV = "KFP_HOROVOD_HEARTBEAT_SECONDS"  # the beat's period; the launcher sets it
MARK = "kfp-horovod-heartbeat"
BEATS_PER_BOUND = 4  # a rank is declared silent only after this many periods without a beat


def period_for(bound_s: float) -> float:
    """The heartbeat period for a silence bound: `BEATS_PER_BOUND` beats fit in it."""
    return min(float(HEARTBEAT_SECONDS), bound_s / BEATS_PER_BOUND)


def _write_stdout(text: str) -> None:
    os.write(1, text.encode())  # one write(2) of one short line: never split by other output


def start_from_env(
    environ: Mapping[str, str] | None = None, write: Callable[[str], None] = _write_stdout
) -> Callable[[], None] | None:
    """Start this rank's heartbeat if `HEARTBEAT_ENV` asks for one, first thing in ``python -m
    components.train.rank`` (TensorFlow's import takes seconds), from a daemon thread. ``done`` is
    said at exit (or by the stop returned), after Horovod's own exit handler (registered later,
    so run earlier) has shut Horovod down."""
    value = (os.environ if environ is None else environ).get(HEARTBEAT_ENV, "").strip()
    if not value:
        return None
    try:
        period = float(value)
    except ValueError:
        period = math.nan
    if not (math.isfinite(period) and period > 0):
        raise InputError(f"{HEARTBEAT_ENV} must be a positive number of seconds, got {value!r}")
    line = f"{MARK} {{}} host={socket.gethostname()} pid={os.getpid()}\n"
    stopped = threading.Event()

    def beat() -> None:
        write(line.format("beat"))
        while not stopped.wait(period):
            write(line.format("beat"))

    thread = threading.Thread(target=beat, daemon=True, name="heartbeat")
    thread.start()

    def stop() -> None:
        if not stopped.is_set():
            stopped.set()
            thread.join()
            write(line.format("done"))

    atexit.register(stop)
    return stop
