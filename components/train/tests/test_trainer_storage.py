"""A job whose workers cannot write where it writes stops before its first step: rank 0 checks
the output, TensorBoard, checkpoint and model locations with the workers' identity, and every
rank stops on its word, in one line, exit 2, nothing written. Real 2-rank jobs; the bucket is on
fake-gcs-server behind `standins.fake_gcs.ReadOnlyProxy` (the emulator has no IAM), or there are
no credentials at all."""

from __future__ import annotations

import re
import subprocess

import pytest

from components.train.launcher.launch import job_environment, local_command
from tests.conftest import bucket_objects

pytestmark = pytest.mark.horovod


def stopped_in_one_line(mnist: str, output: str, env: dict[str, str] | None = None) -> str:
    """Run a 2-rank job writing to `output`; its one ``training failed`` line, after checking
    that it ended with exit 2, no traceback and no epoch."""
    args = ["--data", mnist, "--output", output, "--workers", "2", "--epochs", "1"]
    proc = subprocess.run(
        local_command(2, args),
        capture_output=True,
        text=True,
        timeout=240,
        env=job_environment(env),
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr  # every rank stopped on purpose
    failed = [line for line in proc.stdout.splitlines() if "training failed: " in line]
    assert len(failed) == 1 and "[rank 0/2] training failed:" in failed[0], proc.stdout
    assert not re.search(r"Traceback", proc.stdout + proc.stderr), proc.stdout + proc.stderr
    assert "Epoch 1/" not in proc.stdout
    return failed[0]


def test_a_job_whose_workers_cannot_write_stops_before_training(
    mnist_1000: str, gcs_emulator: str, read_only_bucket: str
) -> None:
    output = f"gs://{read_only_bucket}/runs/r1"
    line = stopped_in_one_line(mnist_1000, output)
    assert line.endswith(
        f"training failed: 1 of 2 ranks cannot train: output {output}: the workers' identity "
        f"lacks storage.objects.create on bucket '{read_only_bucket}'; grant it "
        f"roles/storage.objectAdmin on gs://{read_only_bucket} (on GKE: to the Google service "
        "account Workload Identity maps the pod's KSA to, docs/cluster.md section 3; else to "
        "the account of your Application Default Credentials)"
    ), line
    assert bucket_objects(gcs_emulator, read_only_bucket) == ["reg/kept.txt"]


def test_a_job_without_credentials_stops_before_training(
    mnist_1000: str, no_credentials: dict[str, str]
) -> None:
    line = stopped_in_one_line(mnist_1000, "gs://my-bucket/runs/r1", no_credentials)
    assert (
        "1 of 2 ranks cannot train: output gs://my-bucket/runs/r1: the workers' identity "
        "found no Google credentials to reach bucket 'my-bucket'; provide Application "
        "Default Credentials" in line
    ), line
