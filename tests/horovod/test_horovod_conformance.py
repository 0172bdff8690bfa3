"""The Horovod the project ships, checked on values: every collective and Keras piece the trainer
and the elastic path use, under each launcher (tests/horovod/README.md lists them, with where
each is used). One real 2-rank job per launcher runs every check (tests/horovod/jobs.py); each
test asserts on what the ranks reported for one check, and shows the values when it fails. And
``horovodrun --check-build`` reports the pinned version, built with TensorFlow, MPI and Gloo.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.horovod.jobs import CHECKS, CONTROLLERS, REPO, WORLD, Launch, launch
from tests.horovod.keras_checks import STEPS, WARMUP_EPOCHS, WARMUP_LR, WARMUP_STEPS

pytestmark = pytest.mark.conformance
by_controller = pytest.mark.parametrize("controller", CONTROLLERS)

Launched = Callable[[str], Launch]
# The installed horovodrun script, run with horovod.tensorflow imported first: its check forks
# one process per question (TensorFlow? MPI? Gloo? ...), and each fork would import TensorFlow
# again; forks of this process have it already (7 s of CPU instead of 34 s here).
CHECK_BUILD = """
import runpy, sys
import horovod.tensorflow
sys.argv = [sys.argv[1], "--check-build"]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


@pytest.fixture(scope="session")
def launched(tmp_path_factory: pytest.TempPathFactory) -> Launched:
    """``launched(controller)``: that launcher's job, run once per session on first use."""
    done: dict[str, Launch] = {}

    def get(controller: str) -> Launch:
        if controller not in done:
            done[controller] = launch(controller, tmp_path_factory.mktemp(controller))
        return done[controller]

    return get


def test_horovodrun_check_build_lists_the_pinned_version_tensorflow_mpi_and_gloo() -> None:
    horovodrun = Path(sys.executable).with_name("horovodrun")
    assert horovodrun.exists(), f"{horovodrun}: no horovodrun next to this Python (make install)"
    proc = subprocess.run(
        [sys.executable, "-c", CHECK_BUILD, str(horovodrun)],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    source = (REPO / "make" / "horovod" / "SOURCE").read_text()
    version = re.search(r"^HOROVOD_VERSION=(\S+)$", source, re.M)
    assert version is not None and f"Horovod v{version.group(1)}:" in proc.stdout, proc.stdout
    marks = re.findall(r"^\s*\[(X| )\] (\w+)", proc.stdout, re.M)
    assert {"TensorFlow", "MPI", "Gloo"} <= {n for mark, n in marks if mark == "X"}, proc.stdout


def per_rank(launched: Launched, controller: str, check: str) -> list[Any]:
    """Every rank's values for `check` under `controller`, rank 0 first; fails with the
    traceback a rank recorded, or with the job's output if a rank recorded nothing."""
    run = launched(controller)
    found = []
    for rank in range(WORLD):
        path = run.results / f"{check}.rank{rank}.json"
        if not path.exists():
            pytest.fail(
                f"{controller}: rank {rank} wrote no result for {check} (exit code "
                f"{run.returncode}); the job's last lines:\n{run.tail()}"
            )
        result = json.loads(path.read_text())
        if "error" in result:
            pytest.fail(f"{controller}: rank {rank}'s {check} raised:\n{result['error']}")
        found.append(result["values"])
    return found


def same_on_every_rank(values: list[Any], what: str) -> Any:
    assert all(v == values[0] for v in values), f"{what} differs between ranks: {values}"
    return values[0]


def close(got: Any, want: Any, what: str, rtol: float = 1e-6, atol: float = 1e-6) -> None:
    got, want = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
    assert got.shape == want.shape, f"{what}: shape {got.shape}, expected {want.shape}"
    worst = float(np.max(np.abs(got - want))) if got.size else 0.0
    assert np.allclose(got, want, rtol=rtol, atol=atol), (
        f"{what}: largest difference {worst:.3g}\n got      {got.ravel()[:8]}\n expected "
        f"{want.ravel()[:8]}"
    )


@by_controller
def test_the_job_ran_every_check_and_ended_cleanly(launched: Launched, controller: str) -> None:
    run = launched(controller)
    assert run.returncode == 0, f"{run.command}\nexit code {run.returncode}:\n{run.tail()}"
    missing = [
        f"{check}.rank{r}" for check in CHECKS for r in range(WORLD)
        if not (run.results / f"{check}.rank{r}.json").exists()
    ]  # fmt: skip
    assert missing == [], run.tail()


@by_controller
def test_ranks(launched: Launched, controller: str) -> None:
    ranks = per_rank(launched, controller, "ranks")
    assert [r["rank"] for r in ranks] == [0, 1] and {r["size"] for r in ranks} == {WORLD}, ranks
    assert all(r["mpi_built"] and r["gloo_built"] for r in ranks), ranks
    assert {(r["mpi_enabled"], r["gloo_enabled"]) for r in ranks} == {
        (controller == "mpi", controller != "mpi")
    }, ranks
    # Static jobs: one host, two local ranks. Elastic: one host name per slot (LocalHosts).
    local = [(r["local_rank"], r["local_size"]) for r in ranks]
    assert local == ([(0, 1), (0, 1)] if controller == "elastic" else [(0, 2), (1, 2)]), local


@by_controller
@pytest.mark.parametrize("op", ["average", "sum"])
@pytest.mark.parametrize("kind", ["allreduce", "grouped_allreduce"])
def test_allreduce_float32(launched: Launched, controller: str, kind: str, op: str) -> None:
    """Each tensor (eagerly, in a tf.function, or all as one group) reduced over the ranks."""
    ranks = per_rank(launched, controller, f"{kind}_{op}")
    reduce = np.mean if op == "average" else np.sum
    for key in ranks[0]["outputs"]:
        given = [r["inputs"][key.replace("_in_tf_function", "")] for r in ranks]
        want = reduce(np.asarray(given, dtype=np.float32), axis=0)
        same = same_on_every_rank([r["outputs"][key] for r in ranks], f"{op} of {key}")
        close(same, want, f"allreduce {op} of {key}")
        assert not np.allclose(given[0], given[1]), "the ranks' inputs must differ"
    assert {d for r in ranks for d in r["dtypes"]} == {"float32"}


@by_controller
def test_broadcast_variables(launched: Launched, controller: str) -> None:
    ranks = per_rank(launched, controller, "broadcast_variables")
    for root in (0, 1):
        sent = ranks[root][f"root{root}"]["before"]
        assert ranks[0][f"root{root}"]["before"] != ranks[1][f"root{root}"]["before"]
        for r, values in enumerate(ranks):
            assert values[f"root{root}"]["after"] == sent, (
                f"rank {r} after broadcast from {root}: {values[f'root{root}']['after']}, "
                f"expected rank {root}'s {sent}"
            )
        assert {v[f"root{root}"]["dtype"] for v in ranks} == {"int64"}


@by_controller
@pytest.mark.parametrize("check", ["broadcast_object", "allgather_object"])
def test_object_collectives(launched: Launched, controller: str, check: str) -> None:
    """Rank 0's object on every rank; every rank's object, in rank order."""
    ranks = per_rank(launched, controller, check)
    want = ranks[0]["sent"] if check == "broadcast_object" else [r["sent"] for r in ranks]
    for r, values in enumerate(ranks):
        assert values["got"] == want, f"rank {r} got {values['got']}"


@by_controller
def test_allgather(launched: Launched, controller: str) -> None:
    ranks = per_rank(launched, controller, "allgather")
    for key in ranks[0]["inputs"]:
        want = np.concatenate([np.asarray(r["inputs"][key]) for r in ranks]).tolist()
        for r, values in enumerate(ranks):
            assert values["outputs"][key] == want, f"rank {r}'s allgather of {key}"


@by_controller
@pytest.mark.parametrize("check", ["distributed_optimizer", "distributed_optimizer_groups"])
def test_distributed_optimizer(launched: Launched, controller: str, check: str) -> None:
    ranks = per_rank(launched, controller, check)
    weights = same_on_every_rank([r["weights"] for r in ranks], "the weights after the steps")
    assert weights != ranks[0]["initial"], "the steps changed no weight"
    # Adam on the averaged gradient, computed by one process without Horovod.
    close(weights, ranks[0]["expected"], "weights vs Adam on the averaged gradient")
    assert [r["iterations"] for r in ranks] == [STEPS] * WORLD


@by_controller
def test_broadcast_callback(launched: Launched, controller: str) -> None:
    ranks = per_rank(launched, controller, "broadcast_callback")
    assert ranks[0]["initial"] != ranks[1]["initial"], "the ranks must start apart"
    for r, values in enumerate(ranks):
        assert values["weights"] == ranks[0]["initial"], f"rank {r} does not hold rank 0's weights"
    same_on_every_rank([r["optimizer_state"] for r in ranks], "the optimizer's state")
    assert [r["iterations"] for r in ranks] == [2] * WORLD


@by_controller
def test_metric_average_callback(launched: Launched, controller: str) -> None:
    ranks = per_rank(launched, controller, "metric_average_callback")
    own = [r["own"] for r in ranks]
    averaged = same_on_every_rank([r["averaged"] for r in ranks], "the averaged metrics")
    assert own[0][0]["loss"] != own[1][0]["loss"], "the ranks' own losses must differ"
    for epoch, logs in enumerate(averaged):
        assert set(logs) == {"loss", "accuracy"}, logs
        for key, value in logs.items():
            close(value, np.mean([o[epoch][key] for o in own]), f"epoch {epoch + 1} {key}")


def warmup_lr(epoch: int, step: int, size: int) -> float:
    """The warmup Horovod documents: from lr / size to lr over the warmup epochs, linear in
    the fraction of epochs done after each step; lr itself once the warmup is over."""
    if epoch >= WARMUP_EPOCHS:
        return WARMUP_LR
    done = epoch + (step + 1) / WARMUP_STEPS
    return WARMUP_LR / size * (1 + done * (size - 1) / WARMUP_EPOCHS)


@by_controller
def test_lr_warmup_callback(launched: Launched, controller: str) -> None:
    ranks = per_rank(launched, controller, "lr_warmup_callback")
    epochs, steps = WARMUP_EPOCHS + 1, WARMUP_STEPS
    want = [warmup_lr(e, s, WORLD) for e in range(epochs) for s in range(steps)]
    used = same_on_every_rank([r["step_lr"] for r in ranks], "the learning rates used")
    close(used, want, "the learning rate of each step")
    logged = same_on_every_rank([r["epoch_lr"] for r in ranks], "the logged learning rates")
    close(logged, [warmup_lr(e, steps - 1, WORLD) for e in range(epochs)], "lr logged per epoch")


@by_controller
def test_elastic_state_commit_restore(launched: Launched, controller: str) -> None:
    for r, values in enumerate(per_rank(launched, controller, "elastic_state_commit_restore")):
        committed, changed, restored = values["committed"], values["changed"], values["restored"]
        for key in committed:
            assert changed[key] != committed[key], f"{key} was not changed after the commit"
            assert restored[key] == committed[key], (
                f"rank {r}: restore gave {key} = {str(restored[key])[:200]}, committed "
                f"{str(committed[key])[:200]}"
            )


@by_controller
def test_elastic_state_sync(launched: Launched, controller: str) -> None:
    ranks = per_rank(launched, controller, "elastic_state_sync")
    sent = ranks[0]["before"]
    for key in sent:
        assert ranks[1]["before"][key] != sent[key], f"the ranks must start with different {key}"
    for r, values in enumerate(ranks):
        for key, value in values["in_attempt"].items():
            assert value == sent[key], f"rank {r} synced {key} = {str(value)[:200]}"


@by_controller
def test_elastic_commit_callback(launched: Launched, controller: str) -> None:
    ranks = per_rank(launched, controller, "elastic_commit_callback")
    trained = same_on_every_rank([r["trained"] for r in ranks], "the trained state")
    assert [e["epoch"] for e in trained["epochs"]] == [1, 2] and trained["epoch"] == 2, trained
    for r, values in enumerate(ranks):
        assert values["commits"] == [1, 2], f"rank {r} committed at epochs {values['commits']}"
        for key, value in values["restored"].items():
            assert value == trained[key], f"rank {r}: restore gave {key} = {str(value)[:200]}"
