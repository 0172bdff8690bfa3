"""Waiting for another process or thread, in the tests, the stand-ins and the benchmarks: for the
event itself, never for a time a loaded machine may miss.

A wait ends when its event comes. It fails at once, naming what it waited for, when whatever
would bring the event has ended (`alive`), and after `HANG_S` otherwise: a ceiling only a hang
reaches, however busy the machine. It never returns quietly without its event.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

HANG_S = 300.0  # what no wait of the suite comes near, even on a loaded machine: a hang
POLL_S = 0.02


def _said(what: str | Callable[[], str]) -> str:
    return what if isinstance(what, str) else what()


def wait_until(
    event: Callable[[], T | None],
    what: str | Callable[[], str],
    *,
    alive: Callable[[], bool] = lambda: True,
    ceiling_s: float = HANG_S,
    poll_s: float = POLL_S,
) -> T:
    """Poll `event()` until it returns something true, and return that. AssertionError naming
    `what` (a text, or a function of the moment that says it, e.g. with a log's tail) once
    `alive()` is false and the event has still not come, or after `ceiling_s`."""
    end = time.monotonic() + ceiling_s
    while True:
        running = alive()  # before the look: an event that came just before the end counts
        if found := event():
            return found
        if not running:
            raise AssertionError(f"ended without {_said(what)}")
        if time.monotonic() > end:
            raise AssertionError(f"no {_said(what)} after {ceiling_s:g} s: a hang")
        time.sleep(poll_s)


def join(thread: threading.Thread, what: str, ceiling_s: float = HANG_S) -> None:
    """Wait for `thread` to end; AssertionError naming `what` if it still runs after
    `ceiling_s` (a thread's join alone returns quietly then)."""
    thread.join(ceiling_s)
    if thread.is_alive():
        raise AssertionError(f"{what} still running after {ceiling_s:g} s: a hang")


class Background:
    """`script` in a daemon thread; `join` waits for its end as `join` does and raises what it
    raised there (an assertion of a test's helper thread fails the test, not a log line)."""

    def __init__(self, script: Callable[[], object], what: str) -> None:
        self.what = what
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(script,), daemon=True)
        self._thread.start()

    def _run(self, script: Callable[[], object]) -> None:
        try:
            script()
        except BaseException as exc:  # raised again by join()
            self.error = exc

    def is_alive(self) -> bool:
        return self._thread.is_alive()

    def join(self, ceiling_s: float = HANG_S) -> None:
        join(self._thread, self.what, ceiling_s)
        if self.error is not None:
            raise self.error
