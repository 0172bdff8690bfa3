"""The Horovod the project ships, checked on values: every collective and Keras piece the trainer
and the elastic path use, under each launcher (tests/horovod/README.md lists them, with where
each is used). One real 2-rank job per launcher runs every check (tests/horovod/jobs.py); each
rank asserts on its own values, and each test reports one check's result. And
``horovodrun --check-build`` reports the pinned version, built with TensorFlow, MPI and Gloo.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ElementTree
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from components.train.launcher import launch as project
from tests.horovod import live_size, one_rank, upstream
from tests.horovod.common import CHECK_BUILD, TOLERANCE, WORLD, built_with
from tests.horovod.jobs import (
    CHECKS,
    CONTROLLERS,
    LAUNCH_TIMEOUT_S,
    REPO,
    STALL_ENV,
    Launch,
    launch,
)

pytestmark = pytest.mark.conformance


@pytest.fixture(scope="session", params=CONTROLLERS)
def job(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Launch:
    """Each launcher's job, run once per session (the tests are grouped by launcher)."""
    return launch(request.param, tmp_path_factory.mktemp(request.param))


def test_horovodrun_check_build_lists_the_pinned_version_tensorflow_mpi_and_gloo() -> None:
    horovodrun = Path(sys.executable).with_name("horovodrun")
    assert horovodrun.exists(), f"{horovodrun}: no horovodrun next to this Python (make install)"
    path = f"{horovodrun.parent}{os.pathsep}{os.environ.get('PATH', '')}"
    proc = subprocess.run(
        [sys.executable, "-c", CHECK_BUILD], env={**os.environ, "PATH": path},
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    source = (REPO / "make" / "horovod" / "SOURCE").read_text()
    version = re.search(r"^HOROVOD_VERSION=(\S+)$", source, re.M)
    assert version is not None and f"Horovod v{version.group(1)}:" in proc.stdout, proc.stdout
    assert {"TensorFlow", "MPI", "Gloo"} <= built_with(proc.stdout), proc.stdout


# The build's record of its controllers (patch 0004) beside its library's own answer.
RECORD_AND_LIBRARY = (
    "import json, horovod.tensorflow as hvd; from horovod.common.util import build_info; "
    "print(json.dumps([build_info().get('controllers'), bool(hvd.mpi_built()), "
    "bool(hvd.gloo_built())]))"
)


def test_the_build_records_the_controllers_its_library_was_compiled_with() -> None:
    """horovod/metadata.json lists MPI and Gloo (what horovodrun's and the launcher's checks
    read, loading no TensorFlow), and the compiled library (hvd.mpi_built(), hvd.gloo_built(),
    answered by the C++ code) agrees."""
    proc = subprocess.run(
        [sys.executable, "-c", RECORD_AND_LIBRARY], capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr
    recorded, mpi, gloo = json.loads(proc.stdout.splitlines()[-1])
    assert sorted(recorded) == ["gloo", "mpi"] and (mpi, gloo) == (True, True)


def per_rank(run: Launch, check: str) -> list[Any]:
    """Every rank's values for `check`, rank 0 first; fails with the traceback a rank recorded
    (its failed assertion), or with the job's output if a rank recorded nothing."""
    found = []
    for rank in range(WORLD):
        path = run.results / f"{check}.rank{rank}.json"
        if not path.exists():
            pytest.fail(
                f"{run.controller}: rank {rank} wrote no result for {check} (exit code "
                f"{run.returncode}); the job's last lines:\n{run.tail()}"
            )
        result = json.loads(path.read_text())
        if "error" in result:
            pytest.fail(f"{run.controller}: rank {rank}'s {check} failed:\n{result['error']}")
        found.append(result["values"])
    return found


def test_the_job_ended_cleanly(job: Launch) -> None:
    """(Each check's own test fails for a rank that wrote no result.)"""
    assert job.returncode == 0, f"{job.command}\nexit code {job.returncode}:\n{job.tail()}"


@pytest.mark.parametrize("check", CHECKS)
def test_check(job: Launch, check: str) -> None:
    """Every rank passed its own assertions (tests/horovod/collectives.py, keras_checks.py,
    callback_checks.py, elastic_checks.py, refusal_checks.py), and what must be identical on
    every rank is."""
    ranks = per_rank(job, check)
    for key, value in ranks[0].get("same", {}).items():
        others = [r["same"][key] for r in ranks[1:]]
        assert all(v == value for v in others), f"{key} differs between ranks: {value}, {others}"


def test_metric_average_is_the_mean_of_the_ranks_own(job: Launch) -> None:
    ranks = per_rank(job, "metric_average_callback")
    own = [r["own"] for r in ranks]
    assert own[0][0]["loss"] != own[1][0]["loss"], "the ranks' own losses must differ"
    for epoch, logs in enumerate(ranks[0]["same"]["averaged"]):
        for key, value in logs.items():
            mean = np.mean([o[epoch][key] for o in own])
            assert value == pytest.approx(mean, rel=1e-6, abs=1e-6), f"epoch {epoch + 1} {key}"


def test_a_one_rank_job_steps_without_the_collective(tmp_path: Path) -> None:
    """A job of one rank (1x1, or each of two independent jobs) has no one to average with: its
    DistributedOptimizer steps as plain Adam, and Horovod's timeline records the one allreduce
    run on purpose and none of the optimizer's (tests/horovod/one_rank.py)."""
    timeline = tmp_path / "timeline.json"
    run = launch(
        "mpi", tmp_path, module="tests.horovod.one_rank", ranks=1,
        env={"HOROVOD_TIMELINE": str(timeline)},
    )  # fmt: skip
    assert run.returncode == 0, f"{run.command}\nexit code {run.returncode}:\n{run.tail()}"
    result = json.loads((run.results / one_rank.RESULT).read_text())
    assert result["max_difference_from_adam"] <= TOLERANCE
    recorded = timeline.read_text()
    assert one_rank.MARKER in recorded, f"the timeline recorded no collective:\n{recorded[:2000]}"
    assert "HorovodGroupedAllreduce" not in recorded, "a one-rank step ran Horovod's allreduce"


@pytest.fixture(scope="session")
def upstream_run(tmp_path_factory: pytest.TempPathFactory) -> dict[int, dict[str, list[str]]]:
    """Horovod's own tests translated to Keras 3 (tests/horovod/upstream), run once by pytest on
    every rank of a 2-rank mpirun job: each rank's outcome of each test ([] when it passed, else
    what pytest recorded: failure, error or skipped, with its message)."""
    run = launch("mpi", tmp_path_factory.mktemp("upstream"), module="tests.horovod.upstream.run")
    assert run.returncode == 0, f"{run.command}\nexit code {run.returncode}:\n{run.tail()}"
    outcomes: dict[int, dict[str, list[str]]] = {}
    for rank in range(WORLD):
        xml = run.results / f"rank{rank}.xml"
        assert xml.exists(), f"rank {rank} wrote no results:\n{run.tail()}"
        outcomes[rank] = {
            "::".join([*case.get("classname", "").split(".")[-2:], case.get("name", "")]): [
                f"{k.tag}: {k.get('message')}" for k in case
            ]
            for case in ElementTree.parse(xml).iter("testcase")
        }
    return outcomes


@pytest.mark.parametrize("name", upstream.TESTS)
def test_horovods_own_test_translated_to_keras_3(
    upstream_run: dict[int, dict[str, list[str]]], name: str
) -> None:
    """(tests/horovod/upstream/README.md: what each test checks and what its translation
    changed.)"""
    for rank, outcomes in upstream_run.items():
        assert name in outcomes, f"rank {rank} did not run {name}"
        assert outcomes[name] == [], f"rank {rank}: {name}: {outcomes[name]}"


def test_the_translations_hold_no_test_left_unchecked(
    upstream_run: dict[int, dict[str, list[str]]],
) -> None:
    """Every test in the translated files is one of `upstream.TESTS` (tf.test.TestCase's
    inherited ``test_session`` is no test: pytest skips it, "Not a test")."""
    for rank, outcomes in upstream_run.items():
        ran = {n for n in outcomes if not n.endswith("::test_session")}
        assert ran == set(upstream.TESTS), f"rank {rank}: {sorted(ran ^ set(upstream.TESTS))}"


def test_a_local_gradient_follows_the_live_size_after_an_elastic_resize(tmp_path: Path) -> None:
    """An elastic job of one rank grows to two (tests/horovod/live_size.py): its local
    variable's gradient was scaled by 1/1 in the step traced at size 1, and by 1/2 when the same
    traced step runs after the resize."""
    hosts = project.LocalHosts(tmp_path)
    hosts.offer(1)
    results = tmp_path / "results"
    program = [sys.executable, "-m", "tests.horovod.live_size", str(results), str(tmp_path)]
    command = project.horovodrun_command(project.elastic_launcher_args(2, 1, hosts), program)
    env = project.job_environment({**os.environ, **STALL_ENV})
    proc = subprocess.run(
        command, cwd=REPO, env=env, capture_output=True, text=True, timeout=LAUNCH_TIMEOUT_S
    )
    assert proc.returncode == 0, f"{command}\n{proc.stdout[-4000:]}{proc.stderr[-4000:]}"
    steps = json.loads((results / live_size.RESULT).read_text())["steps"]
    assert steps == {"1": pytest.approx(1.0), "2": pytest.approx(0.5)}, steps
