"""The register step's parameters, declared once (`components.common.declare`)."""

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
        defaults.MIN_ACCURACY, "the test accuracy a model needs to be registered", minimum=0,
        maximum=1,
    )  # fmt: skip
    model_name: str = param(
        defaults.MODEL_NAME, "the model's name in the registry", check=model_name_problem
    )
    registry_root: str = param(
        "", "the model store: a gs:// folder (or a local path for a local run)",
        check=registry_root_problem,
    )  # fmt: skip


REGISTER_PARAMETERS: list[Declared] = declared(RegisterStep)
