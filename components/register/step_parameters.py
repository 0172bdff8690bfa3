"""The register step's parameters, declared once (`components.common.declare`). Imported by the
pipeline's CLI and the register step's pod.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from components.common import defaults
from components.common.declare import Validated, param

_MODEL_NAME = re.compile(r"^[a-z0-9]([a-z0-9._-]{0,61}[a-z0-9])?$")


def model_name_problem(name: str) -> str | None:
    if _MODEL_NAME.match(name):
        return None
    return f"model_name must be 1-63 lowercase letters, digits, '.', '_' or '-', got {name!r}"


def registry_root_problem(root: str) -> str | None:
    if root:
        return None
    return (
        "registry_root is empty: set it to the model store the run registers its model in, "
        "a gs:// folder such as gs://my-bucket/kfp-horovod/models (or a local path for a "
        "local run)"
    )


@dataclass(frozen=True)
class RegisterStep(Validated):
    """The quality gate and the model store."""

    min_accuracy: float = param(
        defaults.MIN_ACCURACY,
        "the test accuracy a model needs to be registered",
        minimum=0,
        maximum=1,
    )
    model_name: str = param(
        defaults.MODEL_NAME, "the model's name in the registry", check=model_name_problem
    )
    # Required, with no default: a cluster run's registry is a bucket of the user's that outlives
    # the run (the champion is compared across runs), which no default can name; the KFP UI
    # marks a parameter without a default required and asks for it.
    registry_root: str = param(
        help="the model store the run registers its model in: a gs:// folder such as "
        "gs://my-bucket/kfp-horovod/models (a local path for a local run)",
        check=registry_root_problem,
        kw_only=True,
    )
