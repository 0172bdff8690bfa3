"""Can TensorFlow load its CUDA libraries here? Runs in each rank of a GPU job (without importing
TensorFlow), and as ``python -m components.train.rank.cuda --check`` in the trainer images'
build.
"""

from __future__ import annotations

import ctypes
import importlib.util
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import click

from components.common.declare import run_command
from components.common.failure import ExitCode
from components.common.keras_env import tensorflow

# What TF dlopens, by soname (the majors of its CUDA 12.5 / cuDNN 9 / NCCL 2 build), and the
# wheel that ships each. TF registers no GPU unless the first seven load; libnccl serves NCCL
# collectives, libcupti the profiler. libcuda.so.1, the driver, comes from the node, not here.
# TF itself names none of them: tf.sysconfig.get_build_info() gives the CUDA and cuDNN versions
# only (test_cuda.py holds the table to them), and without a GPU TF tries libcudart and
# libcuda alone, so tf.config.list_physical_devices("GPU") is [] in a CPU image and in a GPU
# image on a node without a GPU alike: only this table tells the two apart.
TF_CUDA_LIBRARIES: dict[str, str] = {
    "libcudart.so.12": "nvidia-cuda-runtime-cu12",
    "libcublas.so.12": "nvidia-cublas-cu12",
    "libcublasLt.so.12": "nvidia-cublas-cu12",
    "libcufft.so.11": "nvidia-cufft-cu12",
    "libcusolver.so.11": "nvidia-cusolver-cu12",
    "libcusparse.so.12": "nvidia-cusparse-cu12",
    "libcudnn.so.9": "nvidia-cudnn-cu12",
    "libnccl.so.2": "nvidia-nccl-cu12",
    "libcupti.so.12": "nvidia-cuda-cupti-cu12",
}
# The locked ``tensorflow`` is a CUDA build whose libraries come as the ``nvidia-*-cu12`` wheels of
# ``tensorflow[and-cuda]`` (only the GPU image has them). TF dlopens each by soname, first from its
# wheel's folder (TF's RUNPATH), else by the system loader; `missing_cuda_libraries` does the same
# without importing TensorFlow, so the trainer can refuse a GPU job where one is missing. ``python
# -m components.train.rank.cuda --check --gradient-allreduce host|nccl`` is the images' build-time
# check (every library loads, TF is a CUDA build, Horovod's NCCL build matches the label);
# ``--check-horovod`` checks only the last.
#
# How Horovod reduces gradients between GPUs (NCCL, or host memory), and the image label saying so.
GRADIENT_ALLREDUCE = ("host", "nccl")
GRADIENT_ALLREDUCE_LABEL = "io.kfp-horovod.gradient-allreduce"


def wheel_folder(soname: str) -> Path | None:
    """The folder of `soname`'s wheel, where TF looks first (None: no TF installed)."""
    spec = importlib.util.find_spec("tensorflow")
    if spec is None or not spec.submodule_search_locations:
        return None
    name = TF_CUDA_LIBRARIES[soname].removeprefix("nvidia-").removesuffix("-cu12")
    site = Path(next(iter(spec.submodule_search_locations))).parent
    return site / "nvidia" / name.replace("-", "_") / "lib"


def load_library(soname: str, folder: Path | None) -> tuple[bool, str]:
    """dlopen `soname` as TF would: from `folder` if the file is there (and then only there),
    else by the system loader. (True, where from) or (False, why not)."""
    path = folder / soname if folder and (folder / soname).is_file() else None
    try:
        ctypes.CDLL(str(path or soname))
    except OSError as exc:
        why = f"{path} does not load" if path else f"not in {folder}, nor by the system loader"
        return False, f"{why}: {exc} (wheel {TF_CUDA_LIBRARIES[soname]})"
    return True, str(path or "the system loader")


def missing_cuda_libraries(folder: Path | None = None) -> dict[str, str]:
    """soname -> why it does not load, for each CUDA library TF needs, from `folder` (default:
    each one's `wheel_folder`)."""
    loaded = {s: load_library(s, folder or wheel_folder(s)) for s in TF_CUDA_LIBRARIES}
    return {soname: why for soname, (ok, why) in loaded.items() if not ok}


def cuda_build(version: str, info: Mapping[str, Any]) -> tuple[str, list[str]]:
    """The image check's line on TensorFlow `version`'s build, from its
    ``tf.sysconfig.get_build_info()``, and the problem if it is not a CUDA build."""
    if info.get("is_cuda_build") is not True:
        problem = f"TensorFlow {version} is not a CUDA build: {dict(info)}"
        return f"cuda: TensorFlow {version}: not a CUDA build", [problem]
    capabilities = ",".join(info.get("cuda_compute_capabilities") or [])
    return (
        f"cuda: TensorFlow {version}: CUDA {info.get('cuda_version')}, cuDNN "
        f"{info.get('cudnn_version')}, compute capabilities {capabilities}"
    ), []


def check_image(gradient_allreduce: str, cuda: bool = True) -> int:
    """Print what the image has; `ExitCode.OK` if every check passes, else `BAD_INPUT` (the
    problems on stderr).
    Horovod's NCCL build must match `gradient_allreduce` (host: none, nccl: NCCL)."""
    problems: list[str] = []
    if cuda:
        for soname in TF_CUDA_LIBRARIES:
            ok, what = load_library(soname, wheel_folder(soname))
            print(f"cuda: {soname}: {f'loads from {what}' if ok else 'MISSING'}")
            problems += [] if ok else [f"cannot load {soname}: {what}"]
        tf = tensorflow()
        line, not_cuda = cuda_build(tf.__version__, tf.sysconfig.get_build_info())
        print(line)
        problems += not_cuda
    tensorflow()
    import horovod.tensorflow as hvd

    if (gradient_allreduce == "nccl") != bool(nccl := hvd.nccl_built()):
        built = f"with NCCL (version code {nccl})" if nccl else "without NCCL"
        problems.append(
            f"{GRADIENT_ALLREDUCE_LABEL}={gradient_allreduce}, but Horovod was built {built}"
        )
    for problem in problems:
        print(f"cuda check: {problem}", file=sys.stderr)
    if not problems:
        print(f"cuda: Horovod gradient allreduce: {gradient_allreduce}; all checks pass")
    return ExitCode.BAD_INPUT if problems else ExitCode.OK


@click.command(help=(__doc__ or "").splitlines()[0])
@click.option("--check", "what", flag_value="check", help="libraries, CUDA build, Horovod")
@click.option("--check-horovod", "what", flag_value="horovod", help="Horovod's NCCL build only")
@click.option("--gradient-allreduce", type=click.Choice(GRADIENT_ALLREDUCE), required=True)
def command(what: str | None, gradient_allreduce: str) -> int:
    if what is None:
        raise click.UsageError("one of --check or --check-horovod is required")
    return check_image(gradient_allreduce, cuda=what == "check")


def main(argv: list[str] | None = None) -> int:
    return int(run_command(command, argv, "python -m components.train.rank.cuda"))


if __name__ == "__main__":
    sys.exit(main())
