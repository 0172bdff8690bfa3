"""The checkout stands alone: a copy of the tracked files, with no folder beside or above it,
collects the whole suite and validates MPIJob manifests against its own vendored CRD."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_a_copy_of_the_repository_alone_collects_and_finds_its_crd(tmp_path: Path) -> None:
    tracked = (
        subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True)
        .stdout.decode()
        .split("\0")
    )
    copy = tmp_path / "kfp-horovod"
    for name in filter(None, tracked):
        if (ROOT / name).is_file():
            (copy / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, copy / name)
    collect = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider"],
        cwd=copy, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert collect.returncode == 0, collect.stdout[-3000:] + collect.stderr[-3000:]
    assert " tests collected" in collect.stdout or "tests collected" in collect.stdout
    crd = subprocess.run(
        [sys.executable, "-c", "from components.common.crd import find_crd; "
         "from components.train.launcher.cluster.mpijob import MPIJOB; "
         "import components; print(find_crd(MPIJOB), components.__file__)"],
        cwd=copy, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert crd.returncode == 0, crd.stderr
    found, package = crd.stdout.split()
    assert Path(found).is_relative_to(copy) and Path(package).is_relative_to(copy)
