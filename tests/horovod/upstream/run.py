"""One rank's run of Horovod's own tests translated to Keras 3 (README.md): ``python -m
tests.horovod.upstream.run OUT LAUNCHER`` on every rank of a 2-rank job (the conformance
suite's `jobs.launch`), as upstream runs its files (pytest on every rank); pytest writes this
rank's results to ``OUT/rank<r>.xml`` (JUnit XML), which the suite reads."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
FILES = ("tensorflow2_keras.py", "tensorflow_keras3.py")


def main(argv: list[str]) -> int:
    out = Path(argv[0])
    out.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    rank = os.environ.get("OMPI_COMM_WORLD_RANK", os.environ.get("HOROVOD_RANK", "0"))
    pytest.main(
        [
            *(str(HERE / name) for name in FILES),
            "-q",
            "-p",
            "no:cacheprovider",
            "-o",
            "addopts=",
            f"--junitxml={out / f'rank{rank}.xml'}",
        ]
    )
    return 0  # each test's outcome is read from the XML


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
