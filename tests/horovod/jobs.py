"""The conformance suite's jobs: one real 2-rank launch per launcher, started the way the
project starts its own jobs (components/train/launch.py), each running every check once.

- ``mpi``: ``mpirun -np 2 -H localhost:2`` with the project's options (`launch.mpirun_command`:
  waiting ranks yield, no binding, ob1), Open MPI's consent to run as root where this runs as
  root: a static job, as `make run`, the tests and the MPIJob launcher run it.
- ``gloo``: ``horovodrun -np 2 -H localhost:2 --gloo`` through `components.train.launch`: a
  static job on Gloo (the benchmarks' ``gloo`` lever).
- ``elastic``: elastic ``horovodrun --gloo`` with ``--min-np 2 --max-np 2`` and a host
  discovery script listing one name of this machine per slot (`launch.LocalHosts`), exactly as
  `launch.run_local` starts an elastic job.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from components.train.launch import (
    LocalHosts,
    elastic_launcher_args,
    horovodrun_command,
    job_environment,
    static_command,
)
from components.train.mpiwatch import kill_job

REPO = Path(__file__).resolve().parents[2]
WORLD = 2
CONTROLLERS = ("mpi", "gloo", "elastic")
LAUNCH_TIMEOUT_S = 600
# A check that leaves the ranks in different collectives ends the job this soon, not hang it.
STALL_ENV = {"HOROVOD_STALL_CHECK_TIME_SECONDS": "10", "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": "30"}


@dataclass(frozen=True)
class Launch:
    """One finished launch: its command, exit code, output and the folder of results."""

    controller: str
    command: list[str]
    returncode: int | None  # None: killed at LAUNCH_TIMEOUT_S
    output: str
    results: Path

    def tail(self, lines: int = 60) -> str:
        return "\n".join(self.output.splitlines()[-lines:])


def launch_command(controller: str, program: list[str], hosts_dir: Path) -> list[str]:
    """`program` as one job of WORLD ranks under `controller` (see the module docstring)."""
    if controller == "elastic":
        hosts = LocalHosts(hosts_dir)
        hosts.offer(WORLD)
        return horovodrun_command(elastic_launcher_args(WORLD, WORLD, hosts), program)
    return static_command(WORLD, program, controller)


def launch(controller: str, work: Path) -> Launch:
    """Run the conformance worker on WORLD ranks under `controller`; wait for it."""
    results = work / "results"
    program = [sys.executable, "-m", "tests.horovod.worker", str(results), controller]
    command = launch_command(controller, program, work)
    # A static job's ranks each get a core for Horovod's thread, as run_local gives them.
    local_ranks = 0 if controller == "elastic" else WORLD
    env = job_environment({**os.environ, **STALL_ENV}, local_ranks)
    proc = subprocess.Popen(
        command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,
    )  # fmt: skip
    try:
        output, _ = proc.communicate(timeout=LAUNCH_TIMEOUT_S)
        code: int | None = proc.returncode
    except subprocess.TimeoutExpired:
        kill_job(proc.pid)
        output, _ = proc.communicate()
        code = None
    return Launch(controller, command, code, output, results)
