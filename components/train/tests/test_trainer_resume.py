"""A run killed after epoch k resumes at epoch k+1; a damaged latest checkpoint resumes from the
one before; all damaged stops the run instead of starting from scratch."""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from components.common import keras_env
from components.train.launcher.launch import job_environment, local_command
from components.train.launcher.mpiwatch import kill_job
from components.train.rank import checkpoints
from standins.waiting import HANG_S, wait_until

pytestmark = pytest.mark.horovod


def _small_job(data: str, output: Path, epochs: int, *extra: str) -> list[str]:
    return [
        "--data",
        data,
        "--output",
        str(output),
        "--workers",
        "2",
        "--epochs",
        str(epochs),
        "--batch-size-per-worker",
        "32",
        "--threads-per-worker",
        "1",
        "--model",
        "small",
        *extra,
    ]


def test_killed_run_resumes_at_the_next_epoch(
    mnist_1000: str, tmp_path: Path, run_job: Any
) -> None:
    epochs = 6
    # augmentation's draws across ranks, killed, resumed
    args = _small_job(mnist_1000, tmp_path / "out", epochs, "--augment")
    checkpoint_dir = str(tmp_path / "out" / "checkpoints")
    keras_env.tensorflow()  # imported now (`committed` reads with it), not during the wait
    first = subprocess.Popen(
        local_command(2, args),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=job_environment(),
        start_new_session=True,
    )
    with contextlib.suppress(AssertionError):  # no checkpoint: said below, with the output
        wait_until(
            lambda: checkpoints.committed(checkpoint_dir) > 0,
            "a checkpoint",
            alive=lambda: first.poll() is None,
            poll_s=0.05,
        )
    kill_job(first.pid)  # the whole job, as a node loss would
    output, _ = first.communicate(timeout=HANG_S)
    k = checkpoints.committed(checkpoint_dir)
    assert k > 0, f"no checkpoint before the job ended (or a hang): {output}"
    assert 1 <= k < epochs, "the job should have been killed mid-training"
    assert not (tmp_path / "out" / "model").exists(), "a killed run must not export a model"

    second = run_job(2, args)
    assert second.returncode == 0, second.stdout + second.stderr
    out = second.stdout
    assert f"resuming from checkpoint after epoch {k} of {epochs}" in out
    epochs_run = [int(m) for m in re.findall(rf"\] Epoch (\d+)/{epochs}", out)]
    assert epochs_run == list(range(k + 1, epochs + 1)), out  # not again from epoch 1
    summary = json.loads((tmp_path / "out" / "run_summary.json").read_text())
    assert summary["resumed_from_epoch"] == k
    assert checkpoints.committed(checkpoint_dir) == epochs
    assert summary["weights_identical_across_ranks"] is True
    assert summary["config"]["augment"] is True


# --- a damaged latest checkpoint --------------------------------------------------------------

DATA_FILE = "ckpt-{}.data-00000-of-00001"


@pytest.fixture(scope="module")
def two_checkpoints(
    mnist_1000: str, tmp_path_factory: pytest.TempPathFactory, run_job: Any
) -> Path:
    out = tmp_path_factory.mktemp("two-epochs") / "out"
    done = run_job(2, _small_job(mnist_1000, out, 2))
    assert done.returncode == 0, done.stdout + done.stderr
    return out / "checkpoints"


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def test_a_damaged_latest_checkpoint_resumes_from_the_one_before(
    two_checkpoints: Path, mnist_1000: str, tmp_path: Path, run_job: Any
) -> None:
    """The state file corrupt and epoch 2's data truncated: passed over in one line (each kind
    of damage: test_checkpoints.py)."""
    checkpoint_dir = tmp_path / "checkpoints"
    shutil.copytree(two_checkpoints, checkpoint_dir)
    (checkpoint_dir / "checkpoint").write_text('model_checkpoint_path: "ckpt-')
    _truncate(checkpoint_dir / DATA_FILE.format(2))
    args = _small_job(mnist_1000, tmp_path / "out", 3, "--checkpoint-dir", str(checkpoint_dir))
    result = run_job(2, args)
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    (fallback,) = [line for line in out.splitlines() if "; resuming from epoch" in line]
    assert fallback.endswith("; resuming from epoch 1"), fallback
    assert "state file checkpoint is unreadable" in fallback
    assert "after epoch 2 is unreadable" in fallback
    assert "resuming from checkpoint after epoch 1 of 3" in out
    epochs_run = [int(m) for m in re.findall(r"\] Epoch (\d+)/3", out)]
    assert epochs_run == [2, 3], out
    summary = json.loads((tmp_path / "out" / "run_summary.json").read_text())
    assert summary["resumed_from_epoch"] == 1
    assert [p.name for p in (tmp_path / "out").rglob("saved_model.pb")] == ["saved_model.pb"]


def test_committed_checkpoints_that_are_all_unusable_stop_the_run(
    two_checkpoints: Path, mnist_1000: str, tmp_path: Path, run_job: Any
) -> None:
    checkpoint_dir = tmp_path / "checkpoints"
    shutil.copytree(two_checkpoints, checkpoint_dir)
    for epoch in (1, 2):
        _truncate(checkpoint_dir / DATA_FILE.format(epoch))
    args = _small_job(mnist_1000, tmp_path / "out", 3, "--checkpoint-dir", str(checkpoint_dir))
    result = run_job(2, args)
    assert result.returncode != 0
    assert f"checkpoints were written to {checkpoint_dir}, but none can be resumed from" in (
        result.stdout + result.stderr
    )
    assert "Epoch 1/3" not in result.stdout  # not from scratch
    assert not (tmp_path / "out" / "model").exists()
    # every rank stopped on it (a clear line from rank 0), none left to die in a collective:
    # no rank's traceback
    assert "[rank 0/2] training failed: " in result.stdout
    assert result.returncode == 2, result.stderr  # AllRanksError's exit code, passed on by mpirun
    tagged_traceback = r"^\[[\d,]+\]<std(out|err)>:Traceback"
    assert not re.search(tagged_traceback, result.stdout + result.stderr, re.M)
