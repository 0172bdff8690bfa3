"""Start the trainer as ONE Horovod job: mpirun for a static job, horovodrun for an elastic one.
Runs in the launcher: the train step's pod (``training_backend=local``), ``run-local``'s step,
and, as ``python -m components.train.launcher.launch``, an elastic cluster job's launcher.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from components.common.defaults import STALL_SHUTDOWN_SECONDS
from components.common.failure import (
    ExitCode,
    ExpectedError,
    InputError,
    Stopped,
    one_line_failures,
    stops_on_signals,
)
from components.common.processes import Started
from components.train.config import TrainConfig, to_argv
from components.train.launcher.log_dedup import RankLines
from components.train.launcher.mpiwatch import watch
from components.train.launcher.preflight import check_job_before_launch
from components.train.rank.gloo_timeout import ELASTIC_GLOO_TIMEOUT_S, GLOO_TIMEOUT_ENV
from components.train.rank.heartbeat import HEARTBEAT_ENV, period_for

# A static job runs `mpirun_command` (a local job's and a cluster launcher's) under the heartbeat
# watch (`components.train.launcher.mpiwatch`). Horovod's MPI controller measured faster than Gloo's
# TCP over loopback (bench/README.md) once a waiting rank yields its core (`YIELD_WHEN_IDLE`). An
# elastic job runs ``horovodrun --gloo`` (elastic Horovod has no MPI) as ``python -m
# components.train.launcher.launch ARGS``: horovodrun's command line, its Gloo check answered from
# the build's record of its controllers instead of by a process importing all of TensorFlow
# (seconds per launch).
YIELD_WHEN_IDLE = ("-mca", "mpi_yield_when_idle", "1")  # a waiting rank yields its core
TRAINER = (sys.executable, "-m", "components.train.rank")  # every rank's program here
# Rank 0's line saying why the job stopped before training, as it reaches the launcher.
RANK0_FAILED = re.compile(r"\[rank 0/\d+\] training failed: (.+)$")


class LaunchError(ExpectedError):
    """What a local job needs is missing here (mpirun, or a Horovod build with MPI or Gloo), or
    the job failed (`ExitCode.RUN_FAILED`)."""


def mpirun_command(
    world_size: int,
    program: Sequence[str],
    hosts: str | None = None,
    forward: Sequence[str] = (),
    workdir: str | None = None,
) -> list[str]:
    """``mpirun -np N ... PROGRAM`` on `hosts` (default: Open MPI's hostfile), the environment
    `forward`-ed to the ranks (``NAME`` or ``NAME=VALUE``: ranks started over ssh do not
    inherit the launcher's)."""
    command = ["mpirun", "-np", str(world_size), "--tag-output", *(["-H", hosts] if hosts else [])]
    command += ["-bind-to", "none", "-map-by", "slot", "-mca", "pml", "ob1", *YIELD_WHEN_IDLE]
    command += ["-wdir", workdir] if workdir else []
    for name in forward:
        command += ["-x", name]
    return [*command, *program]


def horovodrun_command(args: Sequence[str], program: Sequence[str]) -> list[str]:
    """``horovodrun ARGS PROGRAM``, run as ``python -m components.train.launcher.launch``
    (`main`)."""
    return [sys.executable, "-m", "components.train.launcher.launch", *args, *program]


def local_command(workers: int, args: list[str]) -> list[str]:
    """The trainer as one static job here: ``mpirun -np N ... python -m components.train.rank
    ARGS``."""
    return mpirun_command(workers, [*TRAINER, *args], hosts=f"localhost:{workers}")


# Names of this machine (inet_aton's spellings of 127.0.0.1), one per slot of a local elastic job:
# Horovod's elastic driver blacklists a whole host when one of its ranks fails, so a lost rank
# takes out only its own "host"; horovodrun starts every one here without ssh.
LOOPBACK_NAMES = (
    "localhost",
    "127.0.0.1",
    "127.0.1",
    "127.1",
    "0x7f.1",
    "0x7f.0.1",
    "0x7f.0.0.1",
    "0177.1",
    "0177.0.1",
    "0177.0.0.1",
    "2130706433",
    "0x7f000001",
)


@dataclass(frozen=True)
class LocalHosts:
    """A local elastic job's host discovery: `script` prints what `offer` lists, one name of
    this machine per slot. Listing more slots grows the job at its next commit."""

    directory: Path

    @property
    def script(self) -> Path:
        return self.directory / "discover_hosts.sh"

    def offer(self, slots: int) -> None:
        """List `slots` slots (atomically: the script never reads half a list)."""
        if not 1 <= slots <= len(LOOPBACK_NAMES):
            raise ValueError(
                f"a local elastic job has 1 to {len(LOOPBACK_NAMES)} slots, got {slots}"
            )
        hosts = self.directory / "hosts"
        if not self.script.exists():
            self.script.write_text(f"#!/bin/sh\nexec cat '{hosts}'\n")
            self.script.chmod(0o755)
        hosts.with_suffix(".new").write_text("".join(f"{n}:1\n" for n in LOOPBACK_NAMES[:slots]))
        hosts.with_suffix(".new").replace(hosts)


def elastic_launcher_args(workers: int, min_workers: int, hosts: LocalHosts) -> list[str]:
    """Elastic horovodrun's arguments: `min_workers` to `workers` ranks found by `hosts`."""
    listed = len((hosts.directory / "hosts").read_text().split())
    return [
        "-np",
        str(min(listed, workers)),
        "--min-np",
        str(min_workers),
        "--max-np",
        str(workers),
        "--host-discovery-script",
        str(hosts.script),
        "--network-interface",
        "lo",
        "--gloo",
    ]


def job_environment(
    base: dict[str, str] | None = None, local_ranks: int = 0, elastic: bool = False
) -> dict[str, str]:
    """The job's environment (values already in `base` kept): quiet TF C++ logs, unbuffered
    output, a stall bound, Open MPI's consent to run as root, for `local_ranks` ranks here
    rank r's Horovod background thread on core r: 1.10x the 2x1 throughput, arithmetic
    unchanged (docs/performance.md), and for an `elastic` job Gloo's timeout, the bound on a
    survivor's wait when a rank is lost (`ELASTIC_GLOO_TIMEOUT_S`)."""
    env = dict(os.environ if base is None else base)
    if elastic:
        env.setdefault(GLOO_TIMEOUT_ENV, str(ELASTIC_GLOO_TIMEOUT_S))
    if os.geteuid() == 0:  # a CI machine, a container run as root
        env.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
        env.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    if local_ranks > 0:
        cores = sorted(os.sched_getaffinity(0))
        affinity = ",".join(str(cores[r % len(cores)]) for r in range(local_ranks))
        env.setdefault("HOROVOD_THREAD_AFFINITY", affinity)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    env.setdefault("PYTHONUNBUFFERED", "1")
    # If ranks stop agreeing on collectives, Horovod aborts the job instead of hanging.
    env.setdefault("HOROVOD_STALL_CHECK_TIME_SECONDS", "30")
    env.setdefault("HOROVOD_STALL_SHUTDOWN_TIME_SECONDS", str(STALL_SHUTDOWN_SECONDS))
    return env


def require(controller: str) -> None:
    """Raise LaunchError naming the fix unless Horovod has `controller` (without MPI, each of
    mpirun's ranks would be a job of one) and, for MPI, mpirun is installed."""
    if controller == "MPI" and shutil.which("mpirun") is None:
        raise LaunchError(
            "mpirun is not installed: local Horovod jobs run on Open MPI. `make install` installs "
            "Debian's (apt-get install openmpi-bin libopenmpi-dev) and builds Horovod with MPI"
        )
    # The controllers as the build recorded them (make/horovod/patches/0004: CMake writes them
    # into horovod/metadata.json), read without loading a framework: Horovod's extension
    # (hvd.mpi_built()) loads TensorFlow's C++ libraries (+0.5 s a launch in a child process; in
    # this one, +320 MB resident and a later `import ssl` bound to TF's BoringSSL), and
    # upstream's checks imported all of TensorFlow (7-8 s for both).
    from horovod.common.util import gloo_built, mpi_built

    if not {"MPI": mpi_built, "GLOO": gloo_built}[controller]():
        raise LaunchError(
            f"the installed Horovod has no {controller} in its TensorFlow library: reinstall it "
            f"with HOROVOD_WITH_{controller}=1 (make install does)"
        )


def run_local(
    config: TrainConfig,
    timeout_s: float | None = None,
    log: Callable[[str], None] = print,
    env: dict[str, str] | None = None,
    hosts: LocalHosts | None = None,
) -> int:
    """Run the trainer as one job of ``config.world_size`` processes here, its output to `log`;
    returns the exit code (`mpiwatch.watch`'s). PreflightError, starting nothing, for a job that
    cannot train (`check_job_before_launch`). An elastic job finds its slots through `hosts`
    (default: all)."""
    check_job_before_launch(config)
    ranks = 0 if config.elastic else config.world_size  # Horovod's elastic driver watches its own
    job_env = job_environment(env, ranks, elastic=config.elastic)
    bound = float(job_env["HOROVOD_STALL_SHUTDOWN_TIME_SECONDS"])
    with tempfile.TemporaryDirectory(prefix="kfp-horovod-hosts-") as tmp:
        if ranks:
            require("MPI")
            job_env.setdefault(HEARTBEAT_ENV, f"{period_for(bound):g}")
            command = local_command(ranks, to_argv(config))
        else:
            if hosts is None:
                hosts = LocalHosts(Path(tmp))
                hosts.offer(config.world_size)
            args = elastic_launcher_args(config.world_size, config.min_world_size, hosts)
            command = horovodrun_command(args, [*TRAINER, *to_argv(config)])
        return watch(command, ranks, bound, log, env=job_env, timeout_s=timeout_s)


def run_local_job(config: TrainConfig, log: Callable[[str], None] = print) -> None:
    """`run_local`, a line every rank printed alike shown once, raising on failure: InputError
    with rank 0's reason when the ranks stopped on one (the step's one ``FAILED:`` line, so the
    rank's own line is held back), else LaunchError (the ranks' log above says why)."""
    held: list[str] = []
    once = RankLines(log)

    def keep(line: str) -> None:
        if RANK0_FAILED.search(line):
            held.append(line)
        else:
            once(line)

    code = run_local(config, log=keep)
    if code != 0 and held:
        raise InputError(RANK0_FAILED.search(held[-1]).group(1))  # type: ignore[union-attr]
    for line in held:  # a job that succeeded after all: nothing is hidden
        once(line)
    if code != 0:
        raise LaunchError(
            f"the Horovod job failed (exit code {code}); the rank-tagged log above says why. "
            "No model was exported.",
            ExitCode.RUN_FAILED,
        )


def main(argv: list[str] | None = None) -> int:
    """horovodrun's command line (exit code as horovodrun's), its Gloo check answered by the
    build's record (`require`). A stop (SIGTERM, Ctrl-C) ends every process below it in one
    ``STOPPED:`` line, exit 128 + N: horovodrun's own shutdown terminates its workers (SIGKILL
    after 5 s; its multiprocessing helper ends with this process), and its shutdown hook
    (``on_shutdown_signal``, make/horovod/patches/0004) notes the signal and what runs first."""
    from horovod.runner import launch

    stops: list[tuple[Stopped, Started]] = []

    def on_shutdown_signal(signum: int) -> None:
        if not stops:
            stops.append((Stopped(signum), Started.of()))  # noted before any is ended

    with one_line_failures(), stops_on_signals():  # until horovodrun takes the signals
        require("GLOO")
        try:
            launch.run_commandline(
                sys.argv[1:] if argv is None else argv, on_shutdown_signal=on_shutdown_signal
            )
        except Exception:
            if not stops:
                raise
        if stops:  # horovodrun ended with a RuntimeError naming a worker's 143
            stop, below = stops[0]
            stop.ended.append(f"horovodrun ended the {below.describe()} it had started")
            raise stop
    return 0


if __name__ == "__main__":
    sys.exit(main())
