"""How the project's programs fail: an expected error in one line, an unexpected one with its
traceback, and the exit codes they end with. Used by every program: each step's pod, the
launcher, each rank and the pipeline's CLI.
"""

from __future__ import annotations

import contextlib
import enum
import signal
import sys
import threading
from collections.abc import Callable, Iterator

# An expected error is an `ExpectedError`: bad input, or a job or request that was refused or
# failed, raised on purpose by this project's code with a message that says what is wrong. Every
# error type of the project derives from it. A step or a command line run under `one_line_failures`
# prints ``FAILED: <its first line>`` (a job's log tail behind it was streamed already) and exits
# with the error's `exit_code`. Anything else, a ValueError raised inside a library included,
# propagates with its traceback (exit 1). ``run-local`` reads the ``FAILED:`` line back. A stop
# (SIGTERM, SIGINT) under `stops_on_signals` ends what the program started and prints ``STOPPED:
# <signal>: <what was ended>``, exit 128 + N.
#
# `ExitCode` is the one table of exit codes; docs/operating.md lists it (tests/test_exit_codes.py
# reads the two together).
FAILED = "FAILED: "
STOPPED = "STOPPED: "
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)  # kill PID, a supervisor, an IDE; Ctrl-C


class ExitCode(enum.IntEnum):
    """What a process of this project means by its exit code; each code has one meaning."""

    OK = 0
    UNEXPECTED = 1  # Python's own for an uncaught exception: its traceback says where
    BAD_INPUT = 2  # refused in one line before anything was started (click: 2 too)
    PREFLIGHT = 3  # a Horovod job's preflight stopped it before any rank trained
    SILENT_RANK = 4  # the heartbeat watch ended a job whose rank went silent
    RUN_FAILED = 5  # a run or job that was started did not succeed
    TIMED_OUT = 6  # a wait ran out of time; what it waited for goes on
    UNAVAILABLE = 7  # a service did not answer, or answered HTTP 5xx: try again later


SIGNAL_BASE = 128  # a process ended by signal N exits SIGNAL_BASE + N (the shell's, mpirun's)


class ExpectedError(Exception):
    """An error this project raises on purpose; its message is the line a user reads, and the
    process ends with `exit_code` (the class's, unless one is given)."""

    exit_code: int = ExitCode.BAD_INPUT

    def __init__(self, message: str, exit_code: int | None = None) -> None:
        super().__init__(message)
        if exit_code is not None:
            self.exit_code = exit_code


class InputError(ExpectedError, ValueError):
    """Bad input: a value, a file or a location that is not what it must be. A ValueError too,
    so that code catching ValueError (as it catches the libraries' own) keeps working."""


class Stopped(KeyboardInterrupt):
    """A stop asked for by signal `signum` (SIGTERM, or SIGINT: Ctrl-C), raised in the main
    thread by `stops_on_signals`. A KeyboardInterrupt, so that no ``except Exception`` swallows
    it and code that ends its work on Ctrl-C ends it on SIGTERM too; each layer it unwinds
    through notes what it `ended`. The process ends with one ``STOPPED:`` line (`line`) and
    `exit_code`, 128 + N."""

    def __init__(self, signum: int) -> None:
        self.signum = signal.Signals(signum)
        self.ended: list[str] = []
        super().__init__(self.signum.name)

    @property
    def exit_code(self) -> int:
        return SIGNAL_BASE + int(self.signum)

    def line(self) -> str:
        """``STOPPED: <signal>: <what was ended>``: the one line a stopped program prints."""
        what = "; ".join(self.ended) if self.ended else "nothing it had started was running"
        return f"{STOPPED}{self.signum.name}: {what}"


@contextlib.contextmanager
def stops_on_signals(on_stop: Callable[[Stopped], None] | None = None) -> Iterator[None]:
    """Within the block, SIGTERM and SIGINT raise `Stopped` in the main thread, after
    `on_stop(stop)` (run in the signal handler: what must start at once, e.g. passing the
    signal on). Only the first signal: a later one is ignored, so that it cannot cut short the
    cleanup the first one set off. Outside the main thread (where no handler can be set)
    nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    first: list[Stopped] = []

    def handler(signum: int, frame: object) -> None:
        if first:
            return
        first.append(Stopped(signum))
        if on_stop is not None:
            on_stop(first[0])
        raise first[0]

    previous = {s: signal.signal(s, handler) for s in STOP_SIGNALS}
    try:
        yield
    finally:
        for s, old in previous.items():
            signal.signal(s, old)


def reason(exc: BaseException) -> str:
    """The one line an expected error prints: its message's first line."""
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__


@contextlib.contextmanager
def one_line_failures() -> Iterator[None]:
    """An `ExpectedError` ends the process with one ``FAILED:`` line on stderr, after what was
    printed before it, and the error's exit code; a `Stopped` with its ``STOPPED:`` line and
    128 + N."""
    try:
        yield
    except ExpectedError as exc:
        sys.stdout.flush()
        print(f"{FAILED}{reason(exc)}", file=sys.stderr, flush=True)
        raise SystemExit(exc.exit_code) from None
    except Stopped as stop:
        with contextlib.suppress(OSError):  # a reader that went away with the stop
            sys.stdout.flush()
            print(stop.line(), file=sys.stderr, flush=True)
        raise SystemExit(stop.exit_code) from None
