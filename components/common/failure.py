"""How a step fails: an expected error in one line, an unexpected one with its traceback.

An expected error is bad input or a refused job raised on purpose by this project's code: a
`ValueError` (the project's error types derive from it) or a cluster backend's `JobError`. Its
message says what is wrong, so the step prints ``FAILED: <first line>`` (a job's log tail behind
it was streamed already) and exits `EXIT_EXPECTED`. Anything else, a ValueError raised inside a
library included, propagates with its traceback. ``run-local`` reads the ``FAILED:`` line back.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator

FAILED = "FAILED: "
EXIT_EXPECTED = 2


def is_expected(exc: BaseException) -> bool:
    """Whether `exc` is bad input or a refused job raised in this project's own code."""
    # The cluster backends' error, looked up only if loaded: kubernetes comes with it.
    cluster = sys.modules.get("components.train.cluster.job")
    refused = cluster is not None and isinstance(exc, cluster.JobError)
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    innermost = str(tb.tb_frame.f_globals.get("__name__", "")) if tb else ""
    ours = innermost.split(".")[0] in ("components", "pipeline")
    return (isinstance(exc, ValueError) or refused) and ours


def reason(exc: BaseException) -> str:
    """The one line an expected error prints: its message's first line."""
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__


@contextlib.contextmanager
def one_line_failures() -> Iterator[None]:
    """An expected error ends the process with one ``FAILED:`` line and `EXIT_EXPECTED`."""
    try:
        yield
    except Exception as exc:
        if not is_expected(exc):
            raise
        sys.stderr.flush()
        print(f"{FAILED}{reason(exc)}", flush=True)
        raise SystemExit(EXIT_EXPECTED) from None
