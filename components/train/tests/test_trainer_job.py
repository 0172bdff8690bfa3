"""A real 3-rank job on 1,000 real MNIST digits, and what it must show (one job per module, one
claim per test). It trains a user's Keras 3 model (``--model package.module:function``, with
``keras.ops`` and a custom layer) that draws different initial weights on every rank: the
ranks hold one model only because rank 0's state is broadcast, and the claims hold for any
model; an entry point trains across ranks and exports a model that serves without it. It has
no warmup (``--warmup-epochs 0``): the scaled learning rate from the first step. (``--augment``
across ranks: test_trainer_resume; a warmup: test_trainer_warmup.)
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from components.train.summary import read
from tests.test_e2e_local import read_scalars

pytestmark = pytest.mark.horovod

WORKERS = 3
USER_MODEL = "components.train.tests.user_model:per_rank_weights"


@pytest.fixture(scope="module")
def job(mnist_1000: str, tmp_path_factory: pytest.TempPathFactory, run_job: Any) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("job3")
    output, audit = root / "out", root / "audit"
    args = [
        "--data",
        mnist_1000,
        "--output",
        str(output),
        "--workers",
        str(WORKERS),
        "--epochs",
        "2",
        "--batch-size-per-worker",
        "32",
        "--threads-per-worker",
        "1",
        "--warmup-epochs",
        "0",
        "--model",
        USER_MODEL,
    ]
    proc = run_job(WORKERS, args, audit=(audit, output))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    raw = json.loads((output / "run_summary.json").read_text())
    summary = read(str(output / "run_summary.json"))  # the one reader: back into a RunSummary
    return {"proc": proc, "output": output, "audit": audit, "summary": summary, "raw": raw}


def test_ranks_start_from_rank_0s_weights_and_finish_identical(job: dict[str, Any]) -> None:
    """The ranks drew different weights (the model seeds itself from the rank): the broadcast
    gave every rank rank 0's before the first step, and the averaged steps kept them equal."""
    per_rank = job["summary"].per_rank
    assert [r["rank"] for r in per_rank] == [0, 1, 2]
    fingerprints = {r["weights_sha256"] for r in per_rank}
    assert len(fingerprints) == 1, fingerprints
    assert job["summary"].start_weights_identical_across_ranks is True
    assert job["summary"].weights_identical_across_ranks is True


def test_logged_metrics_are_the_mean_of_the_ranks_own(job: dict[str, Any]) -> None:
    """Each rank's own last-epoch metrics differ (disjoint shards); what the run logs and keeps
    is their mean (Horovod's MetricAverageCallback), and the epoch lines say it from the check."""
    s = job["summary"]
    own = [r["own_metrics"] for r in s.per_rank]
    assert len({m["loss"] for m in own}) == WORKERS, own  # three ranks, three own losses
    for key in ("loss", "accuracy"):
        assert s.final_metrics[key] == pytest.approx(sum(m[key] for m in own) / WORKERS, abs=1e-5)
    assert s.metrics_averaged_across_ranks is True
    epoch_lines = [line for line in job["proc"].stdout.splitlines() if "Epoch " in line]
    assert all("(averaged over 3 ranks)" in line for line in epoch_lines), epoch_lines


def test_without_warmup_epoch_1_already_runs_at_the_scaled_rate(job: dict[str, Any]) -> None:
    """``--warmup-epochs 0``: TensorBoard's ``learning_rate`` of every epoch, the first
    included, is the ``lr_scaling`` rule's (linear: the default 0.001 x 3 ranks)."""
    board = read_scalars(job["output"] / "tensorboard")["train"]["learning_rate"]
    assert board == [(1, pytest.approx(0.003, rel=1e-6)), (2, pytest.approx(0.003, rel=1e-6))]


def test_shards_are_disjoint_and_cover_every_sample(job: dict[str, Any]) -> None:
    summary = job["summary"]
    ranges = [tuple(r["sample_range"]) for r in summary.per_rank]
    assert ranges == [(0, 333), (333, 666), (666, 1000)]  # uneven: nothing dropped
    assert [r["samples_per_epoch"] for r in summary.per_rank] == [333, 333, 334]
    assert len({r["steps_per_epoch"] for r in summary.per_rank}) == 1  # same steps: no deadlock
    assert summary.coverage == {
        "samples": 1000,
        "seen_per_epoch": 1000,
        "disjoint": True,
        "covers_all": True,
    }


def test_only_rank_0_writes_files_and_prints_progress(job: dict[str, Any]) -> None:
    audit: Path = job["audit"]
    rank0 = (audit / "rank-0.txt").read_text()
    assert (
        "run_summary.json" in rank0
        and "saved_model.pb" in rank0
        and "checkpoints/.checkpoint." in rank0
    )
    for rank in (1, 2):
        assert (audit / f"rank-{rank}.txt").read_text() == "", f"rank {rank} wrote files"
    out = job["proc"].stdout
    epoch_lines = [line for line in out.splitlines() if "Epoch " in line]
    assert len(epoch_lines) == 2, out  # once per epoch, not once per rank
    assert all(line.startswith("[1,0]<stdout>:[rank 0/3]") for line in epoch_lines)
    for rank in (1, 2):
        assert f"[1,{rank}]<stdout>:" not in out
    assert "3 workers formed ONE job (mpi controller) and trained ONE model" in out
    assert "1 model, exported by rank 0" in out
    assert f"[rank 0/3] model {USER_MODEL}: 13,610 parameters; augmentation off" in out


def test_summary_answers_one_model_or_n(job: dict[str, Any]) -> None:
    models = sorted(p.parent for p in job["output"].rglob("saved_model.pb"))
    assert models == [job["output"] / "model"]  # exactly one model directory
    s, raw = job["summary"], job["raw"]
    assert s.model_uri == str(job["output"] / "model")
    assert s.world_size == s.config.world_size == 3
    assert s.controller == "mpi"  # mpirun, as on the MPIJob (elastic jobs show "gloo")
    assert s.global_batch_size == 96
    assert (s.config.lr_scaling, s.config.learning_rate) == ("linear", 0.001)
    assert s.adam["learning_rate"] == pytest.approx(3 * s.config.learning_rate)
    # the config it ran with, under its own names: no renamed or re-spelled field
    assert raw["config"]["learning_rate"] == 0.001 and "base_learning_rate" not in str(raw)
    assert set(s.final_metrics) == {"loss", "accuracy"}
    assert (s.config.model, s.config.augment, s.model_parameters) == (USER_MODEL, False, 13_610)
    assert all(r["examples_per_second"] > 0 for r in s.per_rank)
    assert s.gradient_allreduce == "host"
    import hashlib

    pb = (job["output"] / "model" / "saved_model.pb").read_bytes()
    assert s.saved_model_sha256 == hashlib.sha256(pb).hexdigest()


def test_every_run_says_whether_the_workers_paid(job: dict[str, Any]) -> None:
    """Each rank's own clock: every rank's step split, measured (its wait for its input too);
    the shares add up to a step."""
    use = job["summary"].resource_use
    assert [r["rank"] for r in use["per_rank"]] == [0, 1, 2]
    shares = ("compute_share", "communication_share", "waiting_share", "input_share")
    assert sum(use[share] for share in shares) == pytest.approx(1.0, abs=1e-3)
    assert 0 < use["compute_share"] < 1 and use["communication_share"] > 0
    assert use["input_share"] > 0  # a step's get_next, timed
    assert all(r["allreduce_ms"] > 0 and r["compute_ms"] > 0 for r in use["per_rank"])
    for r in use["per_rank"]:
        parts = r["compute_ms"] + r["allreduce_ms"] + r["input_ms"]
        assert r["step_ms"] == pytest.approx(parts, abs=0.03)
    # each rank's peak resident memory, in MB: a TensorFlow process's hundreds
    assert all(r["peak_rss_mb"] > 100 for r in job["summary"].per_rank)
    assert use["advice"] and use["estimated_efficiency"] == use["compute_share"]
    out = job["proc"].stdout
    assert "a step: compute " in out and "## Did the workers pay?" not in out  # log, not report


def test_exported_model_loads_and_predicts_in_a_fresh_process(
    job: dict[str, Any], mnist_1000: str
) -> None:
    code = f"""
import hashlib, json, sys, numpy as np, tensorflow as tf
from components.common.dataset import read_manifest
from components.common.shard_files import read_split_arrays
loaded = tf.saved_model.load({str(job["output"] / "model")!r})
x, y = read_split_arrays(tf, read_manifest({mnist_1000!r}), "test")
sig = loaded.signatures["serving_default"]
p = sig(image=tf.constant(x[:200]))["probabilities"].numpy()
digest = hashlib.sha256()
for v in [*loaded.trainable_variables, *loaded.non_trainable_variables]:
    digest.update(v.numpy().tobytes())
print(json.dumps({{"shape": list(p.shape), "acc": float((p.argmax(1) == y[:200]).mean()),
                  "sums_to_1": bool(np.allclose(p.sum(1), 1, atol=1e-5)),
                  "fp": digest.hexdigest(), "keras": "keras" in sys.modules,
                  "horovod": "horovod" in sys.modules,
                  "user_module": {USER_MODEL.split(":")[0]!r} in sys.modules}}))
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["shape"] == [200, 10]  # serving_default: image [n, 28, 28, 1] -> probabilities
    assert result["sums_to_1"] is True
    assert result["horovod"] is False  # the model needs no Horovod to load
    assert result["user_module"] is False  # nor the user's module: the SavedModel holds it
    assert result["acc"] > 0.5  # 2 short epochs on 1,000 digits: well above chance (0.1)
    assert result["fp"] == job["summary"].per_rank[0]["weights_sha256"]  # the trained weights
