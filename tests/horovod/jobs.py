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

Every rank runs ``python -m tests.horovod.jobs OUT CONTROLLER`` (`main`): it starts as the
trainer starts (`components.train.trainer.run`: Keras 2 selected by `keras_env.keras` before
Horovod is imported, then ``hvd.init()``), runs every check of `CHECKS` in order, and writes
what each returned to ``OUT/<check>.rank<r>.json`` (``{"values": ...}`` or ``{"error":
traceback}``, and the seconds it took) as soon as it is done. The assertions are the tests'
(tests/horovod/test_horovod_conformance.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from components.train.launch import (
    LocalHosts,
    elastic_launcher_args,
    horovodrun_command,
    job_environment,
    static_command,
)
from components.train.mpiwatch import kill_job
from tests.horovod import collectives, elastic_checks, keras_checks
from tests.horovod.common import Rank

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
    program = [sys.executable, "-m", "tests.horovod.jobs", str(results), controller]
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


Check = Callable[[Rank], dict[str, Any]]

# Every check, in the order every rank runs them (each its collectives in the same order).
CHECKS: dict[str, Check] = {
    **collectives.CHECKS,
    **keras_checks.CHECKS,
    **elastic_checks.CHECKS,
}


def _plain(value: Any) -> Any:
    """JSON for numpy values (float32 as the float it is exactly)."""
    if isinstance(value, np.ndarray | np.generic):
        return value.tolist()
    raise TypeError(f"not JSON: {type(value).__name__}")


def run_checks(out: Path, controller: str) -> int:
    """Start as the trainer does, run `CHECKS`, write each result; the number that raised."""
    from components.common import keras_env

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    keras = keras_env.keras()  # first: Keras 2 and the `keras` alias, before Horovod loads
    import horovod.tensorflow.keras as hvd
    import tensorflow as tf

    hvd.init()
    me = Rank(hvd, tf, keras, controller, rank=hvd.rank(), size=hvd.size())
    failed = 0
    for name, check in CHECKS.items():
        start = time.monotonic()
        try:
            result: dict[str, Any] = {"values": check(me)}
        except Exception:
            result = {"error": traceback.format_exc()}
            failed += 1
        result["seconds"] = round(time.monotonic() - start, 2)
        path = out / f"{name}.rank{me.rank}.json"
        path.write_text(json.dumps(result, default=_plain))
    return failed


def main(argv: list[str]) -> int:
    out, controller = Path(argv[0]), argv[1]
    out.mkdir(parents=True, exist_ok=True)
    failed = run_checks(out, controller)
    # A check that raised is reported by its own test; the job itself ran to its end.
    print(f"conformance worker: {len(CHECKS)} checks run, {failed} raised", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
