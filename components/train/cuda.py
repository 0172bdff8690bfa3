"""Can TensorFlow load its CUDA libraries here? And the GPU trainer image's build-time check.

The locked ``tensorflow`` 2.21.0 wheel is a CUDA build, but its CUDA, cuDNN and NCCL libraries
come separately: as the ``nvidia-*-cu12`` wheels of ``tensorflow[and-cuda]`` (the GPU trainer
image has them; the CPU trainer image and the dev venv do not). TF dlopens them by soname when
it sets up a GPU, searching first the directories its own RUNPATH names (``$ORIGIN/../nvidia/
<lib>/lib``: where those wheels put them), then the system loader's (``LD_LIBRARY_PATH``,
``ld.so.cache``, ``/usr/lib``). :func:`missing_cuda_libraries` loads each one the same way,
without importing TensorFlow (milliseconds where they are absent), and says which cannot be
loaded and why: the trainer uses it to refuse a GPU job in a CPU image.

``python -m components.train.cuda --check --gradient-allreduce host|nccl`` is the GPU image's
build-time check (images/trainer/Dockerfile): TF is a CUDA build, every library of
:data:`TF_CUDA_LIBRARIES` loads, and Horovod's NCCL build matches the image's label
(:data:`GRADIENT_ALLREDUCE_LABEL`). ``--check-horovod`` checks only the last (the CPU image).
"""

from __future__ import annotations

import argparse
import ctypes
import importlib.util
import os
import struct
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

# What TF 2.21.0 dlopens, by soname (tsl's dso_loader.cc: "lib<name>.so.<major>", the majors of
# its CUDA 12.5 / cuDNN 9 / NCCL 2 build), and the tensorflow[and-cuda] wheel that ships each.
# TF's GPU set-up (dlopen_checker.cc, TryDlopenCUDALibraries) registers no GPU unless the first
# seven load; libnccl.so.2 serves TF's NCCL collectives and Horovod's NCCL operations;
# libcupti.so.12 TF's profiler. Observed here (LD_DEBUG=libs, no GPU): libcudart.so.12 at
# import, libcuda.so.1 on the first device query. libcuda.so.1 is the driver: it comes from the
# node (the NVIDIA container runtime mounts it), never from the image, so it is not listed.
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
# TF's own libraries, relative to its package: their RUNPATHs name the nvidia wheels' folders.
TF_LIBRARIES = (
    "libtensorflow_framework.so.2",
    "libtensorflow_cc.so.2",
    "python/_pywrap_tensorflow_internal.so",
)
# How Horovod reduces gradients between GPUs: NCCL, or its MPI/Gloo collectives on host memory.
GRADIENT_ALLREDUCE = ("host", "nccl")
# The image label that says which (images/trainer/Dockerfile sets it from its build arg).
GRADIENT_ALLREDUCE_LABEL = "io.kfp-horovod.gradient-allreduce"

_PT_LOAD, _PT_DYNAMIC = 1, 2
_DT_NULL, _DT_STRTAB, _DT_RPATH, _DT_RUNPATH = 0, 5, 15, 29


@dataclass(frozen=True)
class Loaded:
    """One library's outcome: `path` it loaded from (None: by the system loader), or `error`."""

    soname: str
    path: Path | None
    error: str | None


def runpath(elf: Path) -> list[str]:
    """The DT_RUNPATH (else DT_RPATH) entries of a 64-bit little-endian ELF file, unexpanded."""
    with elf.open("rb") as f:
        head = f.read(64)
        if head[:4] != b"\x7fELF" or head[4:6] != b"\x02\x01":
            raise ValueError(f"{elf}: not a 64-bit little-endian ELF file")
        (phoff,) = struct.unpack_from("<Q", head, 0x20)
        phentsize, phnum = struct.unpack_from("<HH", head, 0x36)
        f.seek(phoff)
        table = f.read(phentsize * phnum)
        loads, dynamic = [], None
        for i in range(phnum):
            kind, _, offset, vaddr, _, size, _, _ = struct.unpack_from(
                "<IIQQQQQQ", table, i * phentsize
            )
            if kind == _PT_LOAD:
                loads.append((vaddr, offset, size))
            elif kind == _PT_DYNAMIC:
                dynamic = (offset, size)
        if dynamic is None:
            return []
        f.seek(dynamic[0])
        entries = _dynamic_entries(f.read(dynamic[1]))
        where = entries.get(_DT_RUNPATH, entries.get(_DT_RPATH))
        if where is None or _DT_STRTAB not in entries:
            return []
        strtab = next(
            (
                off + entries[_DT_STRTAB] - va
                for va, off, size in loads
                if va <= entries[_DT_STRTAB] < va + size
            ),
            None,
        )
        if strtab is None:
            raise ValueError(f"{elf}: its string table is in no loaded segment")
        f.seek(strtab + where)
        return [entry for entry in _c_string(f).split(":") if entry]


def _dynamic_entries(data: bytes) -> dict[int, int]:
    """tag -> value of an ELF64 dynamic section, up to DT_NULL (first value of each tag)."""
    entries: dict[int, int] = {}
    for i in range(0, len(data) - 15, 16):
        tag, value = struct.unpack_from("<qQ", data, i)
        if tag == _DT_NULL:
            break
        entries.setdefault(tag, value)
    return entries


def _c_string(f: BinaryIO) -> str:
    """The NUL-terminated string at the file's position."""
    raw = b""
    while b"\0" not in raw:
        chunk = f.read(4096)
        if not chunk:
            break
        raw += chunk
    return raw.split(b"\0", 1)[0].decode()


def tensorflow_dir() -> Path | None:
    """The installed ``tensorflow`` package's folder, without importing it (None: not installed)."""
    spec = importlib.util.find_spec("tensorflow")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def tensorflow_library_dirs(tf_dir: Path | None = None) -> list[Path]:
    """The folders TF's libraries' RUNPATHs name, ``$ORIGIN`` expanded, in order, once each."""
    tf_dir = tensorflow_dir() if tf_dir is None else tf_dir
    dirs: list[Path] = []
    if tf_dir is None:
        return dirs
    for name in TF_LIBRARIES:
        library = tf_dir / name
        if not library.is_file():
            continue
        for entry in runpath(library):
            origin = str(library.parent)
            path = Path(
                os.path.normpath(entry.replace("${ORIGIN}", origin).replace("$ORIGIN", origin))
            )
            if path not in dirs:
                dirs.append(path)
    return dirs


def load_library(soname: str, search_dirs: Sequence[Path]) -> Loaded:
    """dlopen `soname` as TF would: from the first of `search_dirs` that has it, else by the
    system loader. The library stays loaded (TF's own dlopen of it then finds it loaded)."""
    for folder in search_dirs:
        candidate = folder / soname
        if candidate.is_file():
            try:
                ctypes.CDLL(str(candidate))
            except OSError as exc:
                return Loaded(soname, candidate, f"{candidate} does not load: {exc}")
            return Loaded(soname, candidate, None)
    try:
        ctypes.CDLL(soname)
    except OSError as exc:
        where = "TensorFlow's library folders" if search_dirs else "TensorFlow (not installed)"
        return Loaded(soname, None, f"not in {where}, nor found by the system loader ({exc})")
    return Loaded(soname, None, None)


def load_cuda_libraries(search_dirs: Sequence[Path] | None = None) -> list[Loaded]:
    """Load each of :data:`TF_CUDA_LIBRARIES` (`search_dirs`: default TF's RUNPATH folders)."""
    dirs = tensorflow_library_dirs() if search_dirs is None else list(search_dirs)
    return [load_library(soname, dirs) for soname in TF_CUDA_LIBRARIES]


def missing_cuda_libraries(search_dirs: Sequence[Path] | None = None) -> dict[str, str]:
    """soname -> why it cannot be loaded, for each CUDA library TF needs that does not load
    here (empty: all load). Imports no TensorFlow; `search_dirs` as in load_cuda_libraries."""
    return _missing(load_cuda_libraries(search_dirs))


def _missing(libraries: Sequence[Loaded]) -> dict[str, str]:
    return {
        lib.soname: f"{lib.error} (wheel {TF_CUDA_LIBRARIES[lib.soname]})"
        for lib in libraries
        if lib.error is not None
    }


def tensorflow_problems() -> tuple[list[str], str]:
    """(problems, summary) of TF's build: it must be a CUDA build. Imports TensorFlow."""
    from components.common.keras_env import tensorflow

    tf = tensorflow()
    info = dict(tf.sysconfig.get_build_info())
    summary = (
        f"TensorFlow {tf.__version__}: CUDA {info.get('cuda_version')}, "
        f"cuDNN {info.get('cudnn_version')}, compute capabilities "
        f"{','.join(info.get('cuda_compute_capabilities') or [])}"
    )
    if tf.test.is_built_with_cuda() and info.get("is_cuda_build"):
        return [], summary
    return [f"TensorFlow {tf.__version__} is not a CUDA build: {info}"], summary


def horovod_problems(gradient_allreduce: str) -> list[str]:
    """[] if Horovod's NCCL build matches `gradient_allreduce` (host: none, nccl: NCCL)."""
    if gradient_allreduce not in GRADIENT_ALLREDUCE:
        raise ValueError(
            f"gradient_allreduce must be one of {GRADIENT_ALLREDUCE}, got {gradient_allreduce!r}"
        )
    from components.common.keras_env import tensorflow

    tensorflow()
    import horovod.tensorflow as hvd

    nccl = hvd.nccl_built()
    if (gradient_allreduce == "nccl") == bool(nccl):
        return []
    built = f"with NCCL (version code {nccl})" if nccl else "without NCCL"
    return [f"{GRADIENT_ALLREDUCE_LABEL}={gradient_allreduce}, but Horovod was built {built}"]


def check_image(gradient_allreduce: str, cuda: bool = True) -> int:
    """Print what the image has; 0 if every check passes, else 1 (the problems on stderr)."""
    problems: list[str] = []
    if cuda:
        libraries = load_cuda_libraries()
        for lib in libraries:
            where = lib.path or "the system loader"
            print(f"cuda: {lib.soname}: {'MISSING' if lib.error else f'loads from {where}'}")
        problems += [f"cannot load {s}: {why}" for s, why in _missing(libraries).items()]
        tf_problems, summary = tensorflow_problems()
        print(f"cuda: {summary}")
        problems += tf_problems
    problems += horovod_problems(gradient_allreduce)
    if not problems:
        print(f"cuda: Horovod gradient allreduce: {gradient_allreduce}; all checks pass")
        return 0
    for problem in problems:
        print(f"cuda check: {problem}", file=sys.stderr)
    return 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m components.train.cuda", description=__doc__.splitlines()[0]
    )
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument(
        "--check", action="store_true", help="the GPU image: CUDA build, libraries, Horovod"
    )
    what.add_argument(
        "--check-horovod", action="store_true", help="only Horovod's NCCL build against the label"
    )
    parser.add_argument("--gradient-allreduce", choices=GRADIENT_ALLREDUCE, required=True)
    args = parser.parse_args(argv)
    return check_image(args.gradient_allreduce, cuda=args.check)


if __name__ == "__main__":
    sys.exit(main())
