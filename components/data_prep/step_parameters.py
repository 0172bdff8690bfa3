"""The data-prep step's parameters, declared once (`components.common.declare`)."""

from __future__ import annotations

from dataclasses import dataclass

from components.common import defaults
from components.common.declare import (
    Declared,
    Validated,
    data_sha256_problem,
    data_source_problem,
    declared,
    param,
)


@dataclass(frozen=True)
class PrepStep(Validated):
    """Where the digits come from, how they are checked, and how they are cut."""

    data_source: str = param(
        "bundled", "bundled (5,000 real digits, offline) or a URL, gs:// path or absolute path "
        "of an mnist.npz", check=data_source_problem,
    )  # fmt: skip
    data_sha256: str = param(
        defaults.MNIST_SHA256, "the source's sha256 ('none': not checked)",
        check=data_sha256_problem,
    )  # fmt: skip
    data_limit: int = param(0, "keep only N samples per split (0: all)", minimum=0)
    shard_size: int = param(defaults.SHARD_SIZE, "samples per shard file", minimum=1)


PREP_PARAMETERS: list[Declared] = declared(PrepStep)
