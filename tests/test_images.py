"""Checks on the images that need no Docker engine: the Dockerfiles pass hadolint (the rules in
.hadolint.yaml), build on the one pinned base, and each image's pinned requirements agree with
the locks; the GPU trainer is the trainer plus TensorFlow's CUDA libraries
(requirements/lock-cuda.txt). What the built images hold and do (their user, their packages,
that their programs import, no credentials, Horovod's build) is tested by running them:
tests/containers/test_images_built.py.
"""

from __future__ import annotations

import importlib.metadata as md
import re
import runpy
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import tomllib
from packaging.requirements import Requirement

from components.common import defaults
from components.common.defaults import IMAGE_NAMES, image_ref

ROOT = Path(__file__).resolve().parent.parent
IMAGES = ROOT / "images"
DOCKERFILES = sorted(IMAGES.glob("*/Dockerfile"))
# Not component images: the offline base, the shared component Dockerfile, the container tests'
# GCS emulator.
SUPPORT_IMAGE_DIRS = {"base", "component", "gcs-emulator"}


# images/pin_requirements.py, which writes the images' pins: its readers of the locks.
PINS = SimpleNamespace(**runpy.run_path(str(IMAGES / "pin_requirements.py")))


def pinned(path: Path) -> dict[str, str]:
    """normalized name -> version of a file of exact pins."""
    return {name: version for name, (_, version) in PINS.read_lock(path).items()}


def test_dockerfiles_pass_hadolint() -> None:
    """Pinned bases from trusted registries, pinned pip installs, pipefail, numeric non-root
    users, no secrets in ENV or ARG: hadolint's rules, configured in .hadolint.yaml."""
    hadolint = Path(sys.executable).with_name("hadolint")
    assert hadolint.is_file(), f"{hadolint} is missing: `make test` and `make lint` install it"
    assert {p.parent.name for p in DOCKERFILES} == {"trainer"} | SUPPORT_IMAGE_DIRS
    command = [str(hadolint), "--no-color", "--config", str(ROOT / ".hadolint.yaml")]
    result = subprocess.run(
        [*command, *map(str, DOCKERFILES)], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_dockerfile_builds_on_the_one_pinned_base() -> None:
    """``ARG BASE_IMAGE`` (which hadolint cannot read through) defaults to defaults.BASE_IMAGE in
    every Dockerfile, an exact Python tag of the offline base's Python, which stands in for it."""
    minor = defaults.OFFLINE_BASE_IMAGE.rpartition("-py3")[2]
    assert re.fullmatch(rf"python:3\.{minor}\.\d+-slim-bookworm", defaults.BASE_IMAGE), minor
    for path in DOCKERFILES:
        if path.parent.name != "base":
            text = path.read_text()
            assert f"\nARG BASE_IMAGE={defaults.BASE_IMAGE}\n" in text, path
            assert re.search(r"^FROM \$\{BASE_IMAGE\}", text, re.M), path


def test_every_image_has_its_folder_and_the_pipeline_uses_only_those(tmp_path: Path) -> None:
    """One images/<name>/requirements.in per IMAGE_NAMES entry (the trainer's Dockerfile builds
    both trainers, the component one the others); the compiled pipeline names only them."""
    from pipeline.build import compile_pipeline

    folders = {p.parent.name for p in IMAGES.glob("*/requirements.in")} - SUPPORT_IMAGE_DIRS
    assert folders == set(IMAGE_NAMES)
    output = tmp_path / "pipeline.yaml"
    compile_pipeline(str(output), image_registry=None, image_tag=None)
    pattern = re.escape(defaults.DEFAULT_IMAGE_REGISTRY) + r"/[^\s'\"]+"
    referenced = set(re.findall(pattern, output.read_text()))
    assert referenced and referenced <= {image_ref(name) for name in IMAGE_NAMES}, referenced


def test_requirements_files_are_generated_from_in_files_and_the_locks() -> None:
    """images/*/requirements.txt are what images/pin_requirements.py makes of the .in files: the
    dependency closure, pinned to the locks (the images install them with --no-deps); every
    component image pins the kfp its components are compiled for."""
    result = subprocess.run(
        [sys.executable, str(IMAGES / "pin_requirements.py"), "--check"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    for image in IMAGE_NAMES:
        kfp = pinned(IMAGES / image / "requirements.txt").get("kfp")
        assert kfp == md.version("kfp"), f"images/{image}: kfp {kfp}"


def test_gpu_trainer_is_the_trainer_plus_tensorflows_cuda_libraries() -> None:
    """The GPU image's closure is the CPU trainer's plus exactly lock-cuda.txt's pins (the same
    TensorFlow wheel: it is a CUDA build), and no other image carries a CUDA wheel."""
    cuda = pinned(PINS.CUDA_LOCK)
    assert cuda and not set(cuda) & set(pinned(PINS.LOCK)), "lock-cuda.txt only adds to the lock"
    trainer = pinned(IMAGES / "trainer" / "requirements.txt")
    assert pinned(IMAGES / "trainer_gpu" / "requirements.txt") == {**trainer, **cuda}
    for path in IMAGES.glob("*/*requirements.txt"):
        if path.parent.name != "trainer_gpu":
            assert not set(pinned(path)) & set(cuda), f"{path} pins CUDA wheels"


def test_cuda_lock_is_what_tensorflow_and_cuda_adds() -> None:
    """lock-cuda.txt pins every requirement of the locked TensorFlow's ``and-cuda`` extra at a
    version it allows, plus only what those need; the dev venv installs none of them."""
    cuda = pinned(PINS.CUDA_LOCK)
    needs = PINS.read_requires(PINS.CUDA_LOCK)
    extra = [
        r
        for spec in md.requires("tensorflow") or []
        if (r := Requirement(spec)).marker is not None
        and r.marker.evaluate({"extra": "and-cuda"})
        and not r.marker.evaluate({"extra": ""})
    ]
    assert extra, "the installed tensorflow has no and-cuda extra"
    for req in extra:
        name = PINS.normalize(req.name)
        assert name in cuda, f"lock-cuda.txt lacks {req} (tensorflow[and-cuda])"
        assert req.specifier.contains(cuda[name]), f"lock-cuda.txt: {name}=={cuda[name]} vs {req}"
    needed = {PINS.normalize(r.name) for r in extra}
    needed |= {dep for name in needed for dep in needs.get(name, [])}
    assert set(cuda) == needed, f"lock-cuda.txt pins more: {sorted(set(cuda) - needed)}"
    installed = {PINS.normalize(d.metadata["Name"]) for d in md.distributions()}
    assert not installed & set(cuda), "the dev venv must not install the CUDA wheels"
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    specs = declared["dependencies"] + sum(declared["optional-dependencies"].values(), [])
    assert not [s for s in specs if "and-cuda" in s], "pyproject.toml declares tensorflow[and-cuda]"


def test_dockerignore_keeps_local_state_and_credentials_out_of_the_build_context() -> None:
    entries = {
        line.strip().rstrip("/")
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    }
    assert {".git", ".venv", "build", "runs", "**/__pycache__", "**/*.pem", "**/*.key"} <= entries
