"""The errors every operation raises: :class:`OpsError` and its subclasses.

Each message names what was wrong: the parameter, the pipeline, the version, the run's failed
task, the HTTP status.
"""

from __future__ import annotations


class OpsError(Exception):
    """An operation against KFP (or its input) failed; the message says what and why.

    `status` is the HTTP status KFP answered with, if any; `transient` is true for HTTP 5xx and
    for network errors (no answer, timeout), which may succeed when tried again.
    """

    def __init__(self, message: str, status: int | None = None, transient: bool = False) -> None:
        super().__init__(message)
        self.status = status
        self.transient = transient


class NotFoundError(OpsError):
    """A named pipeline, version, experiment, run or schedule does not exist."""


class AlreadyExistsError(OpsError):
    """The thing to create exists already (HTTP 409, or found before creating)."""


class ParameterError(OpsError):
    """A pipeline parameter given on the command line is unknown, missing or of the wrong type."""


class CronError(OpsError):
    """A cron expression is not a valid 6-field (seconds first) KFP cron expression."""


class RunFailedError(OpsError):
    """The run finished in a state other than SUCCEEDED."""

    def __init__(self, message: str, run_id: str, state: str, failed_tasks: list[str]) -> None:
        super().__init__(message)
        self.run_id = run_id
        self.state = state
        self.failed_tasks = failed_tasks


class RunTimeoutError(OpsError):
    """The run did not finish within the allowed time."""

    def __init__(self, message: str, run_id: str, state: str) -> None:
        super().__init__(message)
        self.run_id = run_id
        self.state = state
