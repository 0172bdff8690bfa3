"""The processes a program started, found by parentage (psutil), so that a stop can end them all.
Runs in the launcher (local mpirun and horovodrun), ``make serve`` and the pipeline's
``run-local``.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any


# ``mpirun`` and horovodrun run in sessions of their own, out of reach of the terminal's Ctrl-C, and
# a SIGKILLed parent's children are reparented, out of reach of a later search. So they are noted
# first (`Started.of`), and ended from that note.
@dataclass
class Started:
    """Processes noted while they ran, each with its name (a gone process has none to read)."""

    procs: dict[tuple[int, float], tuple[Any, str]] = field(default_factory=dict)

    @classmethod
    def of(cls, pid: int | None = None) -> Started:
        """Every process below `pid` (default: this one), noted now."""
        found = cls()
        found.note(pid)
        return found

    def note(self, pid: int | None = None) -> None:
        """Add the processes below `pid` (default: this one) that are not noted yet."""
        import psutil

        with contextlib.suppress(psutil.Error):
            for proc in psutil.Process(pid or os.getpid()).children(recursive=True):
                with contextlib.suppress(psutil.Error):
                    key = (proc.pid, proc.create_time())  # a pid reused is another process
                    self.procs.setdefault(key, (proc, proc.name()))

    def running(self) -> list[Any]:
        """The noted processes still running (a zombie has ended)."""
        import psutil

        alive = []
        for proc, _ in self.procs.values():
            with contextlib.suppress(psutil.Error):
                if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
                    alive.append(proc)
        return alive

    def kill(self) -> list[str]:
        """SIGKILL every noted process still running; the names of those it killed."""
        import psutil

        killed = []
        for proc in self.running():
            with contextlib.suppress(psutil.Error):
                proc.kill()
                killed.append(self.name(proc))
        return killed

    def wait(self, seconds: float, pid: int | None = None) -> bool:
        """Up to `seconds` for every noted process to end, noting new ones below `pid` as they
        come; whether all have."""
        deadline = time.monotonic() + seconds
        while True:
            self.note(pid)
            if not self.running():
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.05)

    def name(self, proc: Any) -> str:
        return next(name for p, name in self.procs.values() if p is proc)

    def describe(self) -> str:
        """``N processes (mpirun, 2 x python)``: how many were noted, by name."""
        return f"{len(self.procs)} process{'es' if len(self.procs) != 1 else ''} " + names(
            [name for _, name in self.procs.values()]
        )


def names(found: list[str]) -> str:
    """``(mpirun, 2 x python)``: the names of `found`, counted."""
    counted = Counter(found)
    return "(" + ", ".join(f"{n} x {k}" if n > 1 else k for k, n in counted.items()) + ")"
