"""`components.train.hvdrun`: horovodrun's command line without its TensorFlow-importing check."""

from __future__ import annotations

import subprocess
import sys

import pytest

from components.train import hvdrun
from components.train.launch import local_command


def test_the_installed_horovod_is_read_as_a_gloo_build() -> None:
    assert hvdrun.gloo_in_build() is True


def test_a_build_without_gloo_is_refused_before_any_rank_starts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(hvdrun, "GLOO_MARKER", b"no such symbol in any build \x00\x01")
    assert hvdrun.gloo_in_build() is False
    with pytest.raises(hvdrun.GlooNotBuilt, match="HOROVOD_WITH_GLOO=1"):
        hvdrun.main(["-np", "1", "true"])


def test_the_installed_horovod_is_read_as_an_mpi_build(monkeypatch: pytest.MonkeyPatch) -> None:
    assert hvdrun.mpi_in_build() is True
    hvdrun.require_mpi_build()
    monkeypatch.setattr(hvdrun, "MPI_MARKER", b"no such symbol in any build \x00\x01")
    with pytest.raises(hvdrun.MPINotBuilt, match="HOROVOD_WITH_MPI=1"):
        hvdrun.require_mpi_build()


def test_a_gloo_job_is_started_through_hvdrun_and_a_static_one_through_mpirun() -> None:
    command = local_command(2, ["--epochs", "1"], controller="gloo")
    assert command[:3] == [sys.executable, "-m", "components.train.hvdrun"]
    assert command[3:8] == ["-np", "2", "-H", "localhost:2", "--gloo"]
    assert command[8:] == [sys.executable, "-m", "components.train", "--epochs", "1"]
    mpi = local_command(2, ["--epochs", "1"])
    assert mpi[:6] == ["mpirun", "-np", "2", "--tag-output", "-H", "localhost:2"]
    assert mpi[mpi.index("mpi_yield_when_idle") - 1 :][:3] == ["-mca", "mpi_yield_when_idle", "1"]
    assert mpi[-5:] == [sys.executable, "-m", "components.train", "--epochs", "1"]


def test_horovodrun_options_and_exit_codes_pass_through() -> None:
    ok = subprocess.run(
        [sys.executable, "-m", "components.train.hvdrun", "-np", "2", "-H", "localhost:2",
         "--gloo", sys.executable, "-c", "import os; print('rank', os.environ['HOROVOD_RANK'])"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert ok.returncode == 0, ok.stderr[-2000:]
    assert sorted(line.split(":", 1)[1] for line in ok.stdout.splitlines() if "rank" in line) == [
        "rank 0",
        "rank 1",
    ]
    failed = subprocess.run(
        [sys.executable, "-m", "components.train.hvdrun", "-np", "1", "-H", "localhost:1",
         "--gloo", sys.executable, "-c", "raise SystemExit(3)"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert failed.returncode != 0
    assert "exited with non-zero status" in failed.stderr
