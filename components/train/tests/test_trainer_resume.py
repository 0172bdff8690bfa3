"""A run killed (SIGKILL, mid-training) after epoch k and restarted continues at epoch k+1."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from components.train.launch import job_environment, local_command

pytestmark = pytest.mark.horovod


def _wait_for_checkpoint(marker: Path, proc: subprocess.Popen, timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if marker.exists():
            return
        if proc.poll() is not None:
            raise AssertionError(f"job ended before its first checkpoint: {proc.communicate()}")
        time.sleep(0.05)
    raise AssertionError("no checkpoint within the timeout")


def test_killed_run_resumes_at_the_next_epoch(
    mnist_1000: str, tmp_path: Path, run_job: Any
) -> None:
    epochs = 6
    args = [
        "--data", mnist_1000, "--output", str(tmp_path / "out"), "--expected-workers", "2",
        "--epochs", str(epochs), "--batch-size", "16", "--threads-per-worker", "1",
        "--model", "small", "--augment",  # augmentation's draws across ranks, killed, resumed
        "--backward-passes-per-step", "2",  # 31 steps per epoch: a pass spans epochs and a kill
    ]  # fmt: skip
    marker = tmp_path / "out" / "checkpoints" / "latest.json"
    first = subprocess.Popen(
        local_command(2, args), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env=job_environment(), start_new_session=True,
    )  # fmt: skip
    _wait_for_checkpoint(marker, first)
    os.killpg(first.pid, signal.SIGKILL)  # the whole job, as a node loss would
    first.communicate(timeout=60)
    k = json.loads(marker.read_text())["epoch"]
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
    assert json.loads(marker.read_text())["epoch"] == epochs
    assert summary["weights_identical_across_ranks"] is True
    assert summary["levers"]["backward_passes_per_step"] == 2
    assert summary["augment"] is True
