"""Which CUDA libraries TensorFlow needs and cannot load here (placeholder; see the GPU image)."""

from __future__ import annotations

import ctypes
import site
from pathlib import Path

SONAMES = (
    "libcudart.so.12", "libcublas.so.12", "libcublasLt.so.12", "libcufft.so.11",
    "libcusolver.so.11", "libcusparse.so.12", "libcudnn.so.9", "libnccl.so.2",
)  # fmt: skip


def _load(soname: str) -> bool:
    candidates = [soname]
    for root in site.getsitepackages():
        candidates += [str(p) for p in Path(root, "nvidia").glob(f"*/lib/{soname}")]
    for candidate in candidates:
        try:
            ctypes.CDLL(candidate)
            return True
        except OSError:
            continue
    return False


def missing_libraries() -> list[str]:
    """The sonames of `SONAMES` that cannot be loaded here."""
    return [soname for soname in SONAMES if not _load(soname)]
