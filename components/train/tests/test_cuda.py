"""components/train/rank/cuda.py here, where the venv has TensorFlow's CUDA build but none of its
CUDA libraries; the loading is tested with real shared objects in temporary folders, the
folders against TensorFlow's own RUNPATH (``readelf``)."""

from __future__ import annotations

import _ctypes
import importlib.metadata as md
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from components.common.failure import ExitCode
from components.train.rank import cuda

ROOT = Path(__file__).resolve().parents[3]
CUDA_LOCK = ROOT / "requirements" / "lock-cuda.txt"
TF_LIBRARIES = (
    "libtensorflow_framework.so.2",
    "libtensorflow_cc.so.2",
    "python/_pywrap_tensorflow_internal.so",
)


def _run(*code_or_args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *code_or_args], capture_output=True, text=True, timeout=300, cwd=ROOT
    )


def test_every_cuda_library_is_reported_missing_here_without_importing_tensorflow() -> None:
    code = (
        "import json, sys; from components.train.rank.cuda import missing_cuda_libraries as m; "
        "print(json.dumps({'missing': m(), 'tf': 'tensorflow' in sys.modules}))"
    )
    out = _run("-c", code)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result["tf"] is False, "missing_cuda_libraries must not import TensorFlow"
    assert list(result["missing"]) == list(cuda.TF_CUDA_LIBRARIES)
    for soname, why in result["missing"].items():
        assert f"{soname}: cannot open shared object file" in why, why
        assert f"wheel {cuda.TF_CUDA_LIBRARIES[soname]}" in why


def test_each_librarys_wheel_folder_is_where_tensorflows_runpath_looks() -> None:
    readelf = shutil.which("readelf")
    assert readelf, "readelf (binutils, which the Horovod build's g++ brings) is needed"
    folder = cuda.wheel_folder("libcudnn.so.9")
    assert folder is not None
    tf_dir, dirs = folder.parents[2] / "tensorflow", set()
    for name in TF_LIBRARIES:
        dump = subprocess.run([readelf, "-d", str(tf_dir / name)], capture_output=True, text=True)
        found = re.search(r"\((?:RUNPATH|RPATH)\)\s+Library r(?:un)?path: \[(.*)\]", dump.stdout)
        assert found, f"{name} has no RUNPATH per readelf"
        origin = str((tf_dir / name).parent)
        dirs |= {Path(os.path.normpath(d.replace("$ORIGIN", origin))) for d in found[1].split(":")}
    for soname in cuda.TF_CUDA_LIBRARIES:
        assert cuda.wheel_folder(soname) in dirs, f"TensorFlow does not look for {soname} there"


def test_the_folder_is_loaded_from_first_then_the_system_loader(tmp_path: Path) -> None:
    """A file there that does not load is an error, not skipped (each wheel's own folder:
    test_every_cuda_library_is_reported_missing_here_without_importing_tensorflow)."""
    for soname in cuda.TF_CUDA_LIBRARIES:
        shutil.copy(_ctypes.__file__, tmp_path / soname)  # a real shared object
    assert cuda.load_library("libcudnn.so.9", tmp_path) == (True, str(tmp_path / "libcudnn.so.9"))
    assert cuda.missing_cuda_libraries(tmp_path) == {}
    (tmp_path / "libnccl.so.2").unlink()
    assert list(cuda.missing_cuda_libraries(tmp_path)) == ["libnccl.so.2"]
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "libcudnn.so.9").write_text("not a library\n" * 400)
    ok, why = cuda.load_library("libcudnn.so.9", tmp_path / "broken")
    assert not ok and why.startswith(f"{tmp_path / 'broken' / 'libcudnn.so.9'} does not load: ")
    assert "invalid ELF header" in why and why.endswith("(wheel nvidia-cudnn-cu12)")
    ok, why = cuda.load_library("libcudnn.so.9", tmp_path / "nowhere")
    assert not ok and f"not in {tmp_path / 'nowhere'}, nor by the system loader: " in why
    assert "libcudnn.so.9: cannot open shared object file" in why


def test_sonames_agree_with_the_cuda_lock_and_tensorflows_build() -> None:
    """Each soname's major is its wheel's; libcudart's and libcudnn's are TensorFlow's build's."""
    from components.common.keras_env import tensorflow

    pins = dict(
        line.split("#")[0].strip().split("==")
        for line in CUDA_LOCK.read_text().splitlines()
        if line.split("#")[0].strip()
    )
    for soname, wheel in cuda.TF_CUDA_LIBRARIES.items():
        assert wheel in pins, f"{wheel} ({soname}) is not in lock-cuda.txt"
        assert soname.rsplit(".", 1)[1] == pins[wheel].split(".")[0], (soname, pins[wheel])
    info = tensorflow().sysconfig.get_build_info()
    assert info["is_cuda_build"] is True
    cudart = next(s for s in cuda.TF_CUDA_LIBRARIES if s.startswith("libcudart.so."))
    assert cudart == f"libcudart.so.{info['cuda_version'].split('.')[0]}"
    assert f"libcudnn.so.{info['cudnn_version']}" in cuda.TF_CUDA_LIBRARIES


def test_the_image_check_fails_here_naming_each_missing_library_and_its_horovod_passes(
    capsys: pytest.CaptureFixture[str],
) -> None:
    out = _run("-m", "components.train.rank.cuda", "--check", "--gradient-allreduce", "host")
    assert out.returncode == ExitCode.BAD_INPUT, out.stdout + out.stderr
    for soname in cuda.TF_CUDA_LIBRARIES:
        assert f"cuda: {soname}: MISSING" in out.stdout
        assert f"cuda check: cannot load {soname}: " in out.stderr
    assert f"cuda: TensorFlow {md.version('tensorflow')}: CUDA 12" in out.stdout
    assert "all checks pass" not in out.stdout
    ok = _run("-m", "components.train.rank.cuda", "--check-horovod", "--gradient-allreduce", "host")
    assert ok.returncode == 0, ok.stderr
    assert "cuda: Horovod gradient allreduce: host; all checks pass" in ok.stdout
    bad = _run("-m", "components.train.rank.cuda", "--check", "--gradient-allreduce", "mpi")
    assert bad.returncode == 2 and "'mpi' is not one of 'host', 'nccl'" in bad.stderr
    assert cuda.check_image("nccl", cuda=False) == ExitCode.BAD_INPUT  # built without NCCL here
    label = cuda.GRADIENT_ALLREDUCE_LABEL
    assert (
        capsys.readouterr().err == f"cuda check: {label}=nccl, but Horovod was built without NCCL\n"
    )


def test_the_build_line_is_tensorflows_build_info_and_a_cpu_build_fails_the_check() -> None:
    from components.common.keras_env import tensorflow

    line, problems = cuda.cuda_build("2.21.0", tensorflow().sysconfig.get_build_info())
    assert problems == [], problems
    capabilities = r"compute capabilities (sm_\d+,)+compute_\d+"
    assert re.fullmatch(
        rf"cuda: TensorFlow 2\.21\.0: CUDA 12\.\d+\.\d+, cuDNN 9, {capabilities}", line
    ), line
    cpu = {"cpu_compiler": "clang", "is_cuda_build": False, "is_rocm_build": False}
    assert cuda.cuda_build("2.21.0", cpu) == (
        "cuda: TensorFlow 2.21.0: not a CUDA build",
        [f"TensorFlow 2.21.0 is not a CUDA build: {cpu}"],
    )
