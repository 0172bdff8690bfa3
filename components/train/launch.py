"""Start the trainer as ONE Horovod job on this machine.

A static job runs on Open MPI: ``mpirun -np N -H localhost:N ... python -m components.train``
(`components.train.mpirun`, the same command line as the MPIJob's launcher, with waiting ranks
yielding their core). Horovod's MPI controller measured faster than Gloo's TCP over loopback
here (bench/README.md). An elastic job (``min_workers`` > 0) runs elastic horovodrun on Gloo
(``--min-np``/``--max-np``, run by `components.train.hvdrun`) with a host discovery script that
the launcher controls (`LocalHosts`): Horovod's elastic mode has no MPI.

Used by the train component's local backend, by ``make run`` and by the tests. (On a
cluster the MPIJob launcher starts the same trainer across pods instead.)
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from components.common.defaults import STALL_SHUTDOWN_SECONDS
from components.train.config import TrainConfig, to_argv
from components.train.hvdrun import require_mpi_build
from components.train.mpirun import local_mpirun_env, mpirun_command, require_mpirun
from components.train.preflight import check_model_before_launch
from components.train.ranklines import RankLines
from components.train.rankwatch import RankWatch

# How a static local job's ranks form one job: Open MPI (the default), or Gloo (horovodrun
# --gloo; the benchmarks compare the two).
CONTROLLERS = ("mpi", "gloo")


def launcher_args(workers: int) -> list[str]:
    """horovodrun's arguments for one job of `workers` processes on this machine, over Gloo."""
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    return ["-np", str(workers), "-H", f"localhost:{workers}", "--gloo"]


def hvdrun_command(
    workers: int, program: list[str], launcher: list[str] | None = None
) -> list[str]:
    """``horovodrun -np N -H localhost:N --gloo PROGRAM`` (or horovodrun's `launcher` arguments),
    through `components.train.hvdrun` (horovodrun's own command line, less the TensorFlow
    import of its start-up check)."""
    args = launcher_args(workers) if launcher is None else launcher
    return [sys.executable, "-m", "components.train.hvdrun", *args, *program]


def static_command(workers: int, program: list[str], controller: str = "mpi") -> list[str]:
    """`program` as one static job of `workers` local ranks: ``mpirun -np N -H localhost:N``
    (`controller` ``mpi``) or ``horovodrun -np N -H localhost:N --gloo`` (``gloo``)."""
    if controller not in CONTROLLERS:
        raise ValueError(f"controller must be one of {', '.join(CONTROLLERS)}, got {controller!r}")
    if controller == "gloo":
        return hvdrun_command(workers, program)
    return mpirun_command(workers, program, hosts=f"localhost:{workers}")


def local_command(
    workers: int, args: list[str], python: str | None = None, controller: str = "mpi"
) -> list[str]:
    """The trainer as one static job: ``mpirun -np N ... python -m components.train ARGS``."""
    program = [python or sys.executable, "-m", "components.train", *args]
    return static_command(workers, program, controller)


# Names of this machine, one per slot of a local elastic job. Horovod's elastic driver
# blacklists a whole host when one of its ranks fails ("blacklisted slots count == N -> stop
# running"), so N slots of one host named `localhost` would all go with one lost rank. Each of
# these spellings of the loopback address resolves to 127.0.0.1 (inet_aton's forms), so
# horovodrun starts every slot here without ssh, and a lost rank takes out only its own "host".
LOOPBACK_NAMES = (
    "localhost", "127.0.0.1", "127.0.1", "127.1", "0x7f.1", "0x7f.0.1", "0x7f.0.0.1",
    "0177.1", "0177.0.1", "0177.0.0.1", "2130706433", "0x7f000001",
)  # fmt: skip


@dataclass(frozen=True)
class LocalHosts:
    """The host discovery of a local elastic job, which its launcher (or a test) controls.

    ``script`` is horovodrun's ``--host-discovery-script``: it prints ``hosts``, where `offer`
    lists one name of this machine per slot (``localhost:1``, ``127.0.0.1:1``, ...). Listing
    more slots grows the job at its next commit; listing fewer shrinks it.
    """

    directory: Path

    @property
    def script(self) -> Path:
        return self.directory / "discover_hosts.sh"

    @property
    def hosts(self) -> Path:
        return self.directory / "hosts"

    def offer(self, slots: int) -> None:
        """List `slots` slots (atomically: the script never reads half a list)."""
        if not 1 <= slots <= len(LOOPBACK_NAMES):
            raise ValueError(
                f"a local elastic job has 1 to {len(LOOPBACK_NAMES)} slots, got {slots}"
            )
        if not self.script.exists():
            self.script.write_text(f"#!/bin/sh\nexec cat '{self.hosts}'\n")
            self.script.chmod(0o755)
        staged = self.hosts.with_suffix(".new")
        staged.write_text("".join(f"{name}:1\n" for name in LOOPBACK_NAMES[:slots]))
        staged.replace(self.hosts)

    def slots(self) -> int:
        """How many slots are listed now."""
        return len(self.hosts.read_text().split())


def elastic_launcher_args(workers: int, min_workers: int, hosts: LocalHosts) -> list[str]:
    """Elastic horovodrun's arguments: between `min_workers` and `workers` ranks, found by
    `hosts`' script, starting with the slots it lists now (loopback: one host, many names)."""
    return [
        "-np", str(min(hosts.slots(), workers)), "--min-np", str(min_workers),
        "--max-np", str(workers), "--host-discovery-script", str(hosts.script),
        "--network-interface", "lo", "--gloo",
    ]  # fmt: skip


@contextmanager
def local_hosts(config: TrainConfig, hosts: LocalHosts | None) -> Iterator[LocalHosts | None]:
    """`hosts`, or for an elastic job without them, a discovery listing all its slots."""
    if hosts is not None or not config.elastic:
        yield hosts
        return
    with tempfile.TemporaryDirectory(prefix="kfp-horovod-hosts-") as tmp:
        made = LocalHosts(Path(tmp))
        made.offer(config.world_size)
        yield made


def job_command(config: TrainConfig, hosts: LocalHosts | None = None) -> list[str]:
    """The command running `config` as one local job (elastic when ``config.elastic``)."""
    if not config.elastic:
        return local_command(config.world_size, to_argv(config))
    if hosts is None:
        raise ValueError("an elastic job needs its LocalHosts (see local_hosts)")
    launcher = elastic_launcher_args(config.world_size, config.min_world_size, hosts)
    program = [sys.executable, "-m", "components.train", *to_argv(config)]
    return hvdrun_command(config.world_size, program, launcher)


def thread_affinity(local_ranks: int) -> str:
    """``HOROVOD_THREAD_AFFINITY`` for `local_ranks` ranks on this machine: rank r's Horovod
    background thread on core r (cycling over the cores this process may use).

    It measured 1.10x the 2x1 throughput with Gloo (docs/performance.md has today's figures):
    the background thread's Gloo work then stays off the core the other rank computes on. It
    changes no arithmetic, so it is a default of every static local job.
    """
    cores = sorted(os.sched_getaffinity(0))
    return ",".join(str(cores[r % len(cores)]) for r in range(local_ranks))


def job_environment(base: dict[str, str] | None = None, local_ranks: int = 0) -> dict[str, str]:
    """The environment for the job: quiet TF C++ logs, unbuffered output, a stall bound, Open
    MPI's consent to run as root where this runs as root, and for a job of `local_ranks` ranks
    on this machine (> 0), their `thread_affinity`."""
    env = local_mpirun_env(dict(os.environ if base is None else base))
    if local_ranks > 0:
        env.setdefault("HOROVOD_THREAD_AFFINITY", thread_affinity(local_ranks))
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
    hosts: LocalHosts | None = None,
) -> int:
    """Run the trainer as one job of ``config.world_size`` local processes.

    Output is streamed line by line to `log`, with the launcher's own lines about a frozen rank
    (`components.train.rankwatch`). On timeout the whole process group is killed and
    TimeoutError raised. Returns horovodrun's exit code. Raises PreflightError, starting
    nothing, if ``config.model`` is an entry point that does not build a fitting model. An
    elastic job finds its slots through `hosts` (default: all ``config.world_size`` listed).
    """
    check_model_before_launch(config.model)
    if not config.elastic:
        require_mpirun()
        require_mpi_build()
    # An elastic job's ranks are each a host's local rank 0: no per-rank core to give them.
    job_env = job_environment(env, 0 if config.elastic else config.world_size)
    with local_hosts(config, hosts) as found:
        return _stream(job_command(config, found), timeout_s, log, job_env)


# Rank 0's line saying why the job stopped before training (`components.train.trainer`), as
# it reaches the launcher: with mpirun's tag (``[1,0]<stdout>:``) or without.
RANK0_FAILED = re.compile(r"\[rank 0/\d+\] training failed: (.+)$")


def run_local_job(config: TrainConfig, log: Callable[[str], None] = print) -> None:
    """`run_local`, raising when the job fails: ValueError with rank 0's reason when the ranks
    stopped on one (bad input, a refused GPU request: the step's one ``FAILED:`` line, so the
    rank's own line is held back), RuntimeError for any other failure (a crash: the ranks'
    tracebacks are in the log above)."""
    held: list[str] = []
    once = RankLines(log)  # a line every rank prints alike: once

    def keep(line: str) -> None:
        if RANK0_FAILED.search(line):
            held.append(line)
        else:
            once(line)

    code = run_local(config, log=keep)
    if code != 0 and held:
        raise ValueError(RANK0_FAILED.search(held[-1]).group(1))  # type: ignore[union-attr]
    for line in held:  # a job that succeeded after all: nothing is hidden
        once(line)
    if code != 0:
        raise RuntimeError(
            f"the Horovod job failed (exit code {code}); the rank-tagged log above says why. "
            "No model was exported."
        )


def kill_job(pid: int) -> None:
    """SIGKILL the launcher `pid` and every process below it. (Its process group is not enough:
    mpirun puts each rank in a process group of its own.)"""
    import psutil

    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return
    for proc in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.kill()


def _stream(
    command: list[str],
    timeout_s: float | None,
    log: Callable[[str], None],
    env: dict[str, str],
) -> int:
    """Run `command` in its own process group with `env`, its output to `log`; its exit code."""
    proc = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        start_new_session=True,
    )
    # A frozen rank is named, and ends the job within the stall bound (rankwatch.py).
    bound = float(env["HOROVOD_STALL_SHUTDOWN_TIME_SECONDS"])
    watch = RankWatch(proc.pid, bound, log).start()
    timer = None
    if timeout_s is not None:
        import threading

        timer = threading.Timer(timeout_s, kill_job, args=(proc.pid,))
        timer.start()
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            log(line.rstrip("\n"))
        code = proc.wait()
    except BaseException:
        kill_job(proc.pid)
        proc.wait()
        raise
    finally:
        watch.stop()
        if timer is not None:
            timer.cancel()
    if timeout_s is not None and code == -signal.SIGKILL:
        raise TimeoutError(f"training did not finish within {timeout_s:g} s and was killed")
    return code
