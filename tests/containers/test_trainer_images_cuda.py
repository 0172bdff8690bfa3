"""The CUDA check of components/train/cuda.py run in the built trainer images: the GPU image
loads every CUDA library TensorFlow needs from its nvidia-*-cu12 wheels and its Horovod matches
its label; the CPU trainer image reports each of them missing, by soname.

There is no GPU here: this proves what the GPU image contains and that it loads, not that it
trains on a GPU (libcuda.so.1, the driver, comes from a GPU node).
"""

from __future__ import annotations

from typing import Any

import pytest

from components.common import defaults
from components.train import cuda
from tests.containers.support import require_images

pytestmark = pytest.mark.containers


def _check(docker_client: Any, image: str, *args: str) -> tuple[int, str, str]:
    """Run ``python -m components.train.cuda ARGS`` in `image`: (exit code, stdout, stderr)."""
    container = docker_client.containers.run(
        image, ["python", "-m", "components.train.cuda", *args], detach=True,
        labels={"kfp-horovod.test/cuda": "check"},
    )  # fmt: skip
    try:
        code = container.wait(timeout=300)["StatusCode"]
        out = container.logs(stdout=True, stderr=False).decode()
        err = container.logs(stdout=False, stderr=True).decode()
    finally:
        container.remove(force=True)
    return code, out, err


def _label(docker_client: Any, image: str) -> str:
    labels = docker_client.images.get(image).labels or {}
    assert cuda.GRADIENT_ALLREDUCE_LABEL in labels, f"{image} has no gradient-allreduce label"
    value = labels[cuda.GRADIENT_ALLREDUCE_LABEL]
    assert value in cuda.GRADIENT_ALLREDUCE, value
    return value


def test_gpu_trainer_image_loads_every_cuda_library_from_its_wheels(docker_client: Any) -> None:
    image = require_images(docker_client, "trainer_gpu")["trainer_gpu"]
    allreduce = _label(docker_client, image)
    code, out, err = _check(docker_client, image, "--check", "--gradient-allreduce", allreduce)
    assert code == 0, out + err
    for soname, wheel in cuda.TF_CUDA_LIBRARIES.items():
        folder = wheel.removeprefix("nvidia-").removesuffix("-cu12").replace("-", "_")
        line = next((ln for ln in out.splitlines() if ln.startswith(f"cuda: {soname}: ")), "")
        assert line.endswith(f"/site-packages/nvidia/{folder}/lib/{soname}"), line or out
    assert f"cuda: TensorFlow {defaults.TENSORFLOW_VERSION}: CUDA 12.5" in out
    assert f"cuda: Horovod gradient allreduce: {allreduce}; all checks pass" in out
    # The label is what Horovod was built with: the other value fails the check.
    other = next(v for v in cuda.GRADIENT_ALLREDUCE if v != allreduce)
    code, _, err = _check(docker_client, image, "--check", "--gradient-allreduce", other)
    assert code == 1 and f"{cuda.GRADIENT_ALLREDUCE_LABEL}={other}, but Horovod" in err


def test_cpu_trainer_image_reports_the_cuda_libraries_missing(docker_client: Any) -> None:
    image = require_images(docker_client, "trainer")["trainer"]
    assert _label(docker_client, image) == "host"
    code, out, err = _check(docker_client, image, "--check", "--gradient-allreduce", "host")
    assert code == 1, out + err
    for soname, wheel in cuda.TF_CUDA_LIBRARIES.items():
        assert f"cuda: {soname}: MISSING" in out
        assert f"cuda check: cannot load {soname}: " in err
        assert f"{soname}: cannot open shared object file" in err and f"wheel {wheel}" in err
    assert "all checks pass" not in out
