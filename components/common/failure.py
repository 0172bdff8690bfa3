"""How a step fails: an expected error in one line, an unexpected one with its traceback.

An expected error is bad input or a refused job that this project's code raised on purpose: a
`ValueError`, the project's type for them (`DataError`, `ModelError`, `PreflightError`,
`ManifestError`, `CheckpointError` and every parameter rule's refusal derive from it), or a
cluster backend's `JobError` (an operator that is not installed, a job that failed with
its reason). Its message already says what is wrong, so the step prints ``FAILED: <reason>``
(the message's first line: a cluster job's log tail behind it was streamed into the step's log
already) and exits with `EXIT_EXPECTED`, without a traceback. Anything else, a ValueError
raised inside a library included, propagates, traceback and all, into the step's log.

``run-local`` (`pipeline.local_run`) reads the ``FAILED:`` line back to end the run with
``FAILED: step '<name>': <reason>``.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator

# The first word of a step's last line when it stops on an expected error.
FAILED = "FAILED: "
EXIT_EXPECTED = 2
# The cluster backends' run-time error (kubernetes is imported only where a backend runs).
_CLUSTER_ERROR = ("components.train.cluster.job", "JobError")


# The packages whose code raises expected errors on purpose.
PROJECT_PACKAGES = ("components", "pipeline")


def raised_by_the_project(exc: BaseException) -> bool:
    """Whether the innermost frame of `exc`'s traceback is this project's code."""
    tb = exc.__traceback__
    if tb is None:
        return False
    while tb.tb_next is not None:
        tb = tb.tb_next
    return str(tb.tb_frame.f_globals.get("__name__", "")).split(".")[0] in PROJECT_PACKAGES


def is_expected(exc: BaseException) -> bool:
    """Whether `exc` is bad input or a refused job (see the module's docstring)."""
    module, name = _CLUSTER_ERROR
    cluster = sys.modules.get(module)
    refused = cluster is not None and isinstance(exc, getattr(cluster, name))
    return (isinstance(exc, ValueError) or refused) and raised_by_the_project(exc)


def reason(exc: BaseException) -> str:
    """The one line an expected error prints after ``FAILED: ``: its message's first line."""
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__


@contextlib.contextmanager
def one_line_failures() -> Iterator[None]:
    """Run a step's program: an expected error ends the process with ``FAILED: <reason>`` and
    exit code `EXIT_EXPECTED`, no traceback; any other error propagates unchanged."""
    try:
        yield
    except Exception as exc:
        if not is_expected(exc):
            raise
        sys.stderr.flush()
        print(f"{FAILED}{reason(exc)}", flush=True)
        raise SystemExit(EXIT_EXPECTED) from None
