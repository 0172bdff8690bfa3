"""The installed Horovod is the project's build: the pinned version, with TensorFlow, MPI and
Gloo, as ``horovodrun --check-build`` reports it. (Every rank of the conformance jobs also
reports ``hvd.mpi_built()`` and ``hvd.gloo_built()``: test_horovod_conformance.test_ranks.)"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.conformance

SOURCE = Path(__file__).resolve().parents[2] / "make" / "horovod" / "SOURCE"
# The installed horovodrun script itself, run with horovod.tensorflow imported first: its check
# forks one process per question (TensorFlow? MPI? Gloo? NCCL? ...), and each fork would import
# TensorFlow again; forks of this process have it already (7 s of CPU instead of 34 s here).
CHECK_BUILD = """
import runpy, sys
import horovod.tensorflow
sys.argv = [sys.argv[1], "--check-build"]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def test_horovodrun_check_build_lists_tensorflow_mpi_and_gloo() -> None:
    horovodrun = Path(sys.executable).with_name("horovodrun")
    assert horovodrun.exists(), f"{horovodrun}: no horovodrun next to this Python (make install)"
    proc = subprocess.run(
        [sys.executable, "-c", CHECK_BUILD, str(horovodrun)],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    version = re.search(r"^HOROVOD_VERSION=(\S+)$", SOURCE.read_text(), re.M)
    assert version is not None
    assert f"Horovod v{version.group(1)}:" in proc.stdout, proc.stdout
    marks = re.findall(r"^\s*\[(X| )\] (\w+)", proc.stdout, re.M)
    built = {name for mark, name in marks if mark == "X"}
    assert {"TensorFlow", "MPI", "Gloo"} <= built, proc.stdout
