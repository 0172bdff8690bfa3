"""A real job run as a subprocess with the trainer's job environment, each line of its output
stamped with the time it arrived; shared by the tests and the benchmarks. Not a stand-in for
anything: it lives here so that the tests need not import the benchmarks."""

from __future__ import annotations

import subprocess
import threading
import time
from dataclasses import dataclass, field

from components.train.launch import job_environment


@dataclass
class JobResult:
    """What a finished job printed, when each line arrived and how long it ran."""

    returncode: int
    wall_seconds: float
    lines: list[tuple[float, str]] = field(default_factory=list)
    started: float = 0.0


@dataclass
class RunningJob:
    """A started job whose output a thread reads as it comes, stamping each line."""

    proc: subprocess.Popen[str]
    started: float
    lines: list[tuple[float, str]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append((time.monotonic(), line.rstrip("\n")))


def start_job(command: list[str], env: dict[str, str] | None = None) -> RunningJob:
    """Start `command` with the trainer's job environment; its output is read as it comes."""
    started = time.monotonic()
    proc = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=job_environment(env),
    )
    return RunningJob(proc, started)


def collect(job: RunningJob, timeout_s: float = 600) -> JobResult:
    """Wait for `job` to exit; its lines with arrival times. Raises if it failed."""
    try:
        code = job.proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        job.proc.kill()
        code = job.proc.wait()
    job.reader.join()
    result = JobResult(code, time.monotonic() - job.started, job.lines, job.started)
    if code != 0:
        tail = "\n".join(line for _, line in job.lines[-30:])
        raise RuntimeError(f"job failed with exit code {code}: {job.proc.args!r}\n{tail}")
    return result


def run_job(
    command: list[str], env: dict[str, str] | None = None, timeout_s: float = 600
) -> JobResult:
    """Run `command` to completion (see :func:`collect`)."""
    return collect(start_job(command, env), timeout_s)
