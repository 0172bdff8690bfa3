"""How Adam's settings follow the world size: the ``lr_scaling`` rule.

A job of k ranks takes optimizer steps on a batch k times larger than one rank's. The rules:

- ``linear``: learning rate x k (Goyal et al. 2017, the rule Horovod's examples use);
- ``sqrt``: the square-root rule for Adam of Malladi et al. (NeurIPS 2022, arXiv 2205.10287):
  learning rate x sqrt(k), beta_1 <- 1 - k (1 - beta_1), beta_2 <- 1 - k (1 - beta_2),
  epsilon <- epsilon / sqrt(k);
- ``none``: the single-worker settings, whatever k.

Warm-up (``warmup_epochs``) ramps the learning rate up to the rule's value in every case.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

# tf-keras' Adam defaults: the single-worker settings every rule starts from.
BETA_1, BETA_2, EPSILON = 0.9, 0.999, 1e-7


@dataclass(frozen=True)
class AdamSettings:
    """Adam's hyperparameters for one world size."""

    learning_rate: float
    beta_1: float = BETA_1
    beta_2: float = BETA_2
    epsilon: float = EPSILON

    def apply(self, optimizer: Any) -> None:
        """Set them on a built legacy Keras optimizer (an elastic job's new world size)."""
        for name, value in asdict(self).items():
            setattr(optimizer, name, value)


def adam_settings(rule: str, learning_rate: float, world_size: int) -> AdamSettings:
    """Adam's settings for `world_size` ranks under `rule` (see the module docstring)."""
    k = world_size
    if rule == "linear":
        return AdamSettings(learning_rate * k)
    if rule == "none":
        return AdamSettings(learning_rate)
    if rule == "sqrt":
        return AdamSettings(
            learning_rate * math.sqrt(k),
            1 - k * (1 - BETA_1),
            1 - k * (1 - BETA_2),
            EPSILON / math.sqrt(k),
        )
    raise ValueError(f"unknown lr_scaling rule {rule!r}")


def lr_formula(rule: str, learning_rate: float, world_size: int) -> str:
    """The rule's learning rate in words, e.g. ``0.002 = 0.001 x 2 workers (linear)``."""
    scaled = adam_settings(rule, learning_rate, world_size).learning_rate
    factor = {"linear": f"x {world_size} workers", "sqrt": f"x sqrt({world_size} workers)"}
    how = factor.get(rule, f"for {world_size} workers")
    return f"{scaled:g} = {learning_rate:g} {how} ({rule})"
