"""Fixtures for the trainer's tests: small real MNIST datasets and a real horovodrun."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from components.data_prep.prep import prepare
from components.train.launcher.launch import job_environment, local_command
from standins.commands import static_command

AUDIT_SCRIPT = Path(__file__).with_name("audit_writes.py")
INPUT_AT_EXIT_SCRIPT = Path(__file__).with_name("input_at_exit.py")
JobRunner = Callable[..., subprocess.CompletedProcess]


@pytest.fixture(scope="session")
def mnist_1000(tmp_path_factory: pytest.TempPathFactory) -> str:
    """1,000 real training digits (uneven over 3 ranks: 333/333/334) in shards of 300."""
    out = tmp_path_factory.mktemp("data") / "mnist-1000"
    prepare("bundled", str(out), shard_size=300, data_limit=1000)
    return str(out)


def _run_job(
    workers: int,
    args: list[str],
    timeout: float = 300,
    audit: tuple[Path, Path] | None = None,
    input_at_exit: Path | None = None,
) -> subprocess.CompletedProcess:
    """Run the trainer as a real static job of `workers` ranks (the local launcher's command:
    ``mpirun -np workers``), optionally under the write audit (`audit_writes.py`) or with
    its input watched at exit (`input_at_exit.py`); capture its output."""
    command = local_command(workers, args)
    watch: list[str] = []
    if audit is not None:
        watch = [str(AUDIT_SCRIPT), str(audit[0]), str(audit[1])]
    elif input_at_exit is not None:
        watch = [str(INPUT_AT_EXIT_SCRIPT), str(input_at_exit)]
    if watch:
        program = [sys.executable, *watch, "-m", "components.train.rank", *args]
        command = static_command(workers, program)
    return subprocess.run(
        command, capture_output=True, text=True, timeout=timeout, env=job_environment()
    )


@pytest.fixture(scope="session")
def run_job() -> JobRunner:
    """A function running a real multi-rank job: ``run_job(workers, trainer_args, ...)``."""
    return _run_job


@pytest.fixture
def cluster() -> Iterator[Any]:
    """A Kubernetes API serving the MPIJob, TrainJob and TrainingRuntime APIs
    (`standins.kmock_cluster.Cluster`), for the cluster backends' lifecycle tests."""
    from standins.kmock_cluster import Cluster

    with Cluster() as c:
        yield c
