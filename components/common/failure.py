"""How a step fails: an expected error in one line, an unexpected one with its traceback.

An expected error is bad input or a refused job: a `ValueError`, the project's type for them
(`DataError`, `ModelError`, `PreflightError`, `ManifestError`, `CheckpointError` and every
parameter rule's refusal derive from it), or one of the cluster backends' `JobError`\\s (an
operator that is not installed, a job that failed with its reason). Its message already says
what is wrong, so the step prints ``FAILED: <reason>`` (the message's first line: a cluster
job's log tail behind it was streamed into the step's log already) and exits with
`EXIT_EXPECTED`, without a traceback. Anything else propagates, traceback and all, into the
step's log.

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
_CLUSTER_ERROR = ("components.train.cluster.lifecycle", "JobError")


def is_expected(exc: BaseException) -> bool:
    """Whether `exc` is bad input or a refused job (see the module's docstring)."""
    if isinstance(exc, ValueError):
        return True
    module, name = _CLUSTER_ERROR
    cluster = sys.modules.get(module)
    return cluster is not None and isinstance(exc, getattr(cluster, name))


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
