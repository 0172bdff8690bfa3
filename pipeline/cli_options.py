"""Click options that more than one ``python -m pipeline`` command takes, written once."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click

from components.common import defaults
from components.common.params import LR_SCALINGS

F = TypeVar("F", bound=Callable[..., Any])


def options(*decorators: Callable[[F], F]) -> Callable[[F], F]:
    """One decorator applying `decorators` in the order written (the first is outermost)."""

    def apply(func: F) -> F:
        for decorator in reversed(decorators):
            func = decorator(func)
        return func

    return apply


# The model the trainer trains (TrainConfig.model, .augment): run-local and render-mpijob.
model_options = options(
    click.option(
        "--model",
        default=defaults.MODEL,
        show_default=True,
        help=f"{' or '.join(defaults.MODELS)}, or your own as package.module:function "
        "(importable where the trainer runs; see components/train/README.md)",
    ),
    click.option(
        "--augment/--no-augment",
        default=defaults.AUGMENT,
        show_default=True,
        help="augment the training images (rotation, shifts, shear, zoom; training only)",
    ),
)

# Elastic training (TrainConfig.min_workers): run-local and render-mpijob.
min_workers_option = click.option(
    "--min-workers",
    type=int,
    default=0,
    show_default=True,
    help="0: static (losing a worker ends the job); N > 0: elastic, it goes on with as few as N "
    "workers and grows back to --workers",
)

# How Adam follows the world size (TrainConfig.lr_scaling): run-local and render-mpijob.
lr_scaling_option = click.option(
    "--lr-scaling",
    type=click.Choice(list(LR_SCALINGS)),
    default=defaults.LR_SCALING,
    show_default=True,
    help="how Adam's learning rate (sqrt: and its betas and epsilon) follows the world size",
)
