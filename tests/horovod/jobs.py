"""The conformance suite's jobs: one real 2-rank launch per launcher, with the command lines the
project starts its own jobs with (tests/horovod/README.md has the table). Every rank runs
`main`, which writes each check's ``{"values": ...}`` or ``{"error": traceback}`` to
``OUT/<check>.rank<r>.json`` as soon as it is done.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path

from components.train.launcher import launch as project
from components.train.launcher.mpiwatch import kill_job
from standins.commands import static_command
from tests.horovod import (
    callback_checks,
    collectives,
    elastic_checks,
    keras_checks,
    mixed_precision_checks,
    optimizer_checks,
    refusal_checks,
    tape_checks,
)
from tests.horovod.common import WORLD, Check, Rank

REPO = Path(__file__).resolve().parents[2]
CONTROLLERS = ("mpi", "gloo", "elastic")
LAUNCH_TIMEOUT_S = 600
# A check that leaves the ranks in different collectives ends the job this soon, not hang it;
# checks that count collectives start and stop Horovod's timeline (common.Timeline).
STALL_ENV = {
    "HOROVOD_STALL_CHECK_TIME_SECONDS": "10",
    "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": "30",
    "HOROVOD_TIMELINE": "DYNAMIC",
}


@dataclass(frozen=True)
class Launch:
    controller: str
    command: list[str]
    returncode: int | None  # None: killed at LAUNCH_TIMEOUT_S
    output: str
    results: Path

    def tail(self, lines: int = 60) -> str:
        return "\n".join(self.output.splitlines()[-lines:])


def launch(
    controller: str, work: Path, module: str = "tests.horovod.jobs", ranks: int = WORLD,
    env: dict[str, str] | None = None,
) -> Launch:  # fmt: skip
    """Run `module` (``python -m module RESULTS CONTROLLER``: the conformance worker, unless
    another is named) on `ranks` ranks under `controller`, `env` added; wait for it."""
    results = work / "results"
    program = [sys.executable, "-m", module, str(results), controller]
    if controller == "elastic":
        hosts = project.LocalHosts(work)
        hosts.offer(ranks)
        command = project.horovodrun_command(
            project.elastic_launcher_args(ranks, ranks, hosts), program
        )
    else:
        command = static_command(ranks, program, controller)
    # A static job's ranks each get a core for Horovod's thread, as run_local gives them.
    local_ranks = 0 if controller == "elastic" else ranks
    env = project.job_environment({**os.environ, **STALL_ENV, **(env or {})}, local_ranks)
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


# Every check, in the order every rank runs them (each its collectives in the same order).
CHECKS: dict[str, Check] = {
    **collectives.CHECKS,
    **keras_checks.CHECKS,
    **optimizer_checks.CHECKS,
    **mixed_precision_checks.CHECKS,
    **tape_checks.CHECKS,
    **callback_checks.CHECKS,
    **elastic_checks.CHECKS,
    **refusal_checks.CHECKS,
}


def main(argv: list[str]) -> int:
    """Start as the trainer does (Horovod's Keras API on Keras 3's ``keras``), run `CHECKS`,
    write each result."""
    out, controller = Path(argv[0]), argv[1]
    out.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import horovod.tensorflow.keras as hvd
    import keras
    import tensorflow as tf

    hvd.init()
    me = Rank(hvd, tf, keras, controller, rank=hvd.rank(), size=hvd.size())
    failed = 0
    for name, check in CHECKS.items():
        try:
            result = json.dumps({"values": check(me)})
        except Exception:  # a failed assertion too
            result = json.dumps({"error": traceback.format_exc()})
            failed += 1
        (out / f"{name}.rank{me.rank}.json").write_text(result)
    # A check that raised is reported by its own test; the job itself ran to its end.
    print(f"conformance worker: {len(CHECKS)} checks run, {failed} raised", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
