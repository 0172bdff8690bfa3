"""Start the trainer as ONE Horovod job on this machine: ``horovodrun -np N --gloo`` (run by
`components.train.hvdrun`).

Used by the train component's local backend, by ``make run`` and by the tests. (On a
cluster the MPIJob launcher starts the same trainer across pods instead.)
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable

from components.common.defaults import STALL_SHUTDOWN_SECONDS
from components.train.config import TrainConfig, to_argv
from components.train.preflight import check_model_before_launch
from components.train.rankwatch import RankWatch


def launcher_args(workers: int) -> list[str]:
    """horovodrun's arguments for one job of `workers` processes on this machine, over Gloo."""
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    return ["-np", str(workers), "-H", f"localhost:{workers}", "--gloo"]


def hvdrun_command(workers: int, program: list[str]) -> list[str]:
    """``horovodrun -np N -H localhost:N --gloo PROGRAM``, through `components.train.hvdrun`
    (horovodrun's own command line, less the TensorFlow import of its start-up check)."""
    return [sys.executable, "-m", "components.train.hvdrun", *launcher_args(workers), *program]


def local_command(workers: int, args: list[str], python: str | None = None) -> list[str]:
    """The trainer as one job: ``hvdrun -np N ... python -m components.train ARGS``."""
    return hvdrun_command(workers, [python or sys.executable, "-m", "components.train", *args])


def job_environment(base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment for the job: quiet TF C++ logs, unbuffered output, and a stall bound."""
    env = dict(os.environ if base is None else base)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    env.setdefault("PYTHONUNBUFFERED", "1")
    # If ranks stop agreeing on collectives, Horovod aborts the job instead of hanging.
    env.setdefault("HOROVOD_STALL_CHECK_TIME_SECONDS", "30")
    env.setdefault("HOROVOD_STALL_SHUTDOWN_TIME_SECONDS", str(STALL_SHUTDOWN_SECONDS))
    return env


def run_local(
    config: TrainConfig,
    timeout_s: float | None = None,
    log: Callable[[str], None] = print,
    env: dict[str, str] | None = None,
) -> int:
    """Run the trainer as one job of ``config.world_size`` local processes.

    Output is streamed line by line to `log`, with the launcher's own lines about a frozen rank
    (`components.train.rankwatch`). On timeout the whole process group is killed and
    TimeoutError raised. Returns horovodrun's exit code. Raises PreflightError, starting
    nothing, if ``config.model`` is an entry point that does not build a fitting model.
    """
    check_model_before_launch(config.model)
    command = local_command(config.world_size, to_argv(config))
    job_env = job_environment(env)
    proc = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=job_env,
        start_new_session=True,
    )
    # A frozen rank is named, and ends the job within the stall bound (rankwatch.py).
    bound = float(job_env["HOROVOD_STALL_SHUTDOWN_TIME_SECONDS"])
    watch = RankWatch(proc.pid, bound, log).start()
    timer = None
    if timeout_s is not None:
        import threading

        timer = threading.Timer(timeout_s, lambda: os.killpg(proc.pid, signal.SIGKILL))
        timer.start()
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            log(line.rstrip("\n"))
        code = proc.wait()
    except BaseException:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise
    finally:
        watch.stop()
        if timer is not None:
            timer.cancel()
    if timeout_s is not None and code == -signal.SIGKILL:
        raise TimeoutError(f"training did not finish within {timeout_s:g} s and was killed")
    return code
