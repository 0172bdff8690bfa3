"""A command (mpirun, horovodrun or ``python -m pipeline``) run as a subprocess of a test or a
benchmark with the trainer's job environment, each line of its output stamped with the time it
arrived; the command lines of a static job, and the rank processes below a launcher. Not a
stand-in for anything: it lives here so that the tests need not import the benchmarks."""

from __future__ import annotations

import contextlib
import subprocess
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import psutil

from components.train.launcher.launch import horovodrun_command, job_environment, mpirun_command

RANK_ENVS = ("OMPI_COMM_WORLD_RANK", "HOROVOD_RANK")  # where mpirun / horovodrun put the rank


@dataclass
class CommandResult:
    """What a finished command printed, when each line arrived and how long it ran."""

    returncode: int
    wall_seconds: float
    lines: list[tuple[float, str]] = field(default_factory=list)
    started: float = 0.0


@dataclass
class StartedCommand:
    """A started command whose output a thread reads as it comes, stamping each line."""

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


def start_command(command: list[str], env: dict[str, str] | None = None) -> StartedCommand:
    """Start `command` with the trainer's job environment; its output is read as it comes."""
    started = time.monotonic()
    proc = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=job_environment(env),
    )
    return StartedCommand(proc, started)


def collect(command: StartedCommand, timeout_s: float = 600) -> CommandResult:
    """Wait for `command` to exit; its lines with arrival times. Raises if it failed."""
    try:
        code = command.proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        command.proc.kill()
        code = command.proc.wait()
    command.reader.join()
    result = CommandResult(code, time.monotonic() - command.started, command.lines, command.started)
    if code != 0:
        tail = "\n".join(line for _, line in command.lines[-30:])
        raise RuntimeError(f"command failed with exit code {code}: {command.proc.args!r}\n{tail}")
    return result


def run_to_end(
    command: list[str], env: dict[str, str] | None = None, timeout_s: float = 600
) -> CommandResult:
    """Run `command` to completion (see :func:`collect`)."""
    return collect(start_command(command, env), timeout_s)


def static_command(workers: int, program: list[str], controller: str = "mpi") -> list[str]:
    """`program` as one static job of `workers` ranks here: under mpirun as
    `launch.local_command` starts the trainer, or (`controller` gloo) under ``horovodrun
    --gloo``, which the benchmarks and the conformance suite compare with it."""
    if controller == "gloo":
        args = ["-np", str(workers), "-H", f"localhost:{workers}", "--gloo"]
        return horovodrun_command(args, program)
    return mpirun_command(workers, program, hosts=f"localhost:{workers}")


def rank_processes(root_pid: int) -> dict[int, Any]:
    """The rank processes (psutil) below `root_pid` by rank: the innermost carrying a rank
    variable (horovodrun starts each through a shell; psutil lists parents first)."""
    found = {}
    with contextlib.suppress(psutil.Error):
        for proc in psutil.Process(root_pid).children(recursive=True):
            with contextlib.suppress(psutil.Error):
                env = proc.environ()
                rank = next((env[name] for name in RANK_ENVS if name in env), "")
                if rank.isdigit():
                    found[int(rank)] = proc
    return found


MARK_ENV = "KFP_HOROVOD_TEST_RUN"  # a run's processes inherit it: what a stop must leave none of


def marked_env(mark: str, base: dict[str, str] | None = None) -> dict[str, str]:
    """An environment whose processes, and every process they start, carry `mark`."""
    import os

    return {**(os.environ if base is None else base), MARK_ENV: mark}


def marked_processes(mark: str) -> list[str]:
    """``pid name command`` of every process still running (zombies have ended) that carries
    `mark`, wherever it was reparented: what a stopped run left behind."""
    found = []
    for proc in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            if proc.status() != psutil.STATUS_ZOMBIE and proc.environ().get(MARK_ENV) == mark:
                found.append(f"{proc.pid} {proc.name()} {' '.join(proc.cmdline())}")
    return found
