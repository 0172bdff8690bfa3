"""The register step's parameters, declared once (`components.common.declare`). Imported by the
pipeline's CLI and the register step's pod.
"""

from __future__ import annotations

from dataclasses import dataclass

from components.common import defaults
from components.common.declare import (
    Declared,
    Validated,
    declared,
    model_name_problem,
    param,
    registry_root_problem,
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


REGISTER_PARAMETERS: list[Declared] = declared(RegisterStep)
