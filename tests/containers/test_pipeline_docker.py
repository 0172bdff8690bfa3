"""The whole pipeline with every step in its own image: ``run-local --runner docker``
(kfp.local's DockerRunner), the training step running ``mpirun -np 2`` inside the trainer
image, as the local backend does for a static job."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from components.common import defaults
from tests.containers.support import local_tag, require_images

pytestmark = pytest.mark.containers


def test_pipeline_runs_every_step_in_its_image(docker_client: Any, tmp_path: Path) -> None:
    steps = [name for name in defaults.IMAGE_NAMES if name != "trainer_gpu"]  # not a step's
    images = require_images(docker_client, *steps)
    root = tmp_path / "runs"
    command = [
        sys.executable, "-m", "pipeline", "run-local", "--runner", "docker", "--root", str(root),
        "--workers", "2", "--epochs", "2", "--data-limit", "1000", "--min-accuracy", "0.5",
        "--model", "small", "--image-tag", local_tag(),
    ]  # fmt: skip
    try:
        out = subprocess.run(command, capture_output=True, text=True, timeout=900)
    finally:
        _remove_step_containers(docker_client, set(images.values()), root)
    console = out.stdout + out.stderr
    assert out.returncode == 0, console[-6000:]
    print(*[ln for ln in out.stdout.splitlines() if "finished in" in ln or "workers:" in ln])
    # The console shows the steps' own lines; kfp.local's echo is in the run's log file.
    log_path = re.search(r"^log: (.+)$", out.stdout, re.MULTILINE)
    assert log_path, out.stdout[-3000:]
    log = Path(log_path.group(1)).read_text()
    assert "Found image" not in console

    # Every step ran in its image (kfp.local names the image of each task it starts).
    used = set(re.findall(r"Found image '([^']+)'", log))
    assert used == set(images.values()), used
    # The train step ran mpirun -np 2 in the trainer container: one job of 2 ranks.
    assert "[1,0]<stdout>:[rank 0/2] ONE Horovod job: 2 workers" in log
    summary_path = re.search(r"^run_summary: (.+)$", out.stdout, re.MULTILINE)
    assert summary_path, out.stdout[-3000:]
    summary = json.loads(Path(summary_path.group(1)).read_text())
    assert (summary["world_size"], summary["controller"]) == (2, "mpi")
    assert summary["weights_identical_across_ranks"] is True
    assert "registered as version 1" in out.stdout
    assert list((root / "pipeline-root" / "registry").glob("*/1/saved_model.pb"))


def _remove_step_containers(docker_client: Any, images: set[str], root: Path) -> None:
    """DockerRunner leaves its stopped containers behind; remove the ones this test made: they
    mount this test's pipeline root (a test running at the same time on the same engine has
    its own)."""
    for container in docker_client.containers.list(all=True, filters={"status": "exited"}):
        mounts = [m.get("Source", "") for m in container.attrs.get("Mounts", [])]
        mine = any(Path(m) == root or Path(m).is_relative_to(root) for m in mounts)
        if set(container.image.tags) & images and mine:
            container.remove()


def test_step_images_missing_from_the_engine_are_refused_before_data_prep(
    docker_client: Any, tmp_path: Path
) -> None:
    """``--runner docker`` with a tag no image has: one line naming the images and the make
    target that builds them, before any step (it failed after data prep with Docker's raw
    ``APIError: 500 ... no such host``), nothing written."""
    root, tag = tmp_path / "runs", "no-such-tag-kfp-horovod"
    options = ["--runner", "docker", "--root", str(root), "--image-tag", tag]
    command = [sys.executable, "-m", "pipeline", "run-local", *options]
    out = subprocess.run(command, capture_output=True, text=True, timeout=300)
    lines = (out.stdout + out.stderr).splitlines()
    assert out.returncode == 2 and len(lines) == 1, lines
    assert lines[0].startswith("FAILED: --runner docker: no image ") and f":{tag}" in lines[0]
    assert "build the step images with `make images-local`" in lines[0]
    assert not root.exists()
