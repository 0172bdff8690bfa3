"""The trainer's parameters, `TrainConfig`, and its command line (`to_argv`, `from_argv`):
shared by the train step's pod, the launcher and each rank.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import click

from components.common import defaults, storage
from components.common.declare import (
    Validated,
    declared_options,
    nonempty_problem,
    param,
    run_command,
)
from components.common.failure import InputError

LR_SCALINGS = ("linear", "sqrt", "none")  # `adam_settings`
# Malladi's square-root rule sets beta_1 = 1 - k (1 - 0.9): above 9 ranks it is not an Adam.
SQRT_MAX_WORLD_SIZE = 9
_IDENTIFIER = r"[A-Za-z_][A-Za-z0-9_]*"
# A user's model: ``package.module:function`` (dotted module path, one function name).
ENTRY_POINT = re.compile(rf"^{_IDENTIFIER}(\.{_IDENTIFIER})*:{_IDENTIFIER}$")


def model_problem(model: object) -> str | None:
    """Why `model` is neither a built-in model nor a ``package.module:function`` entry point.
    Only the form: whether it builds a fitting model is the trainer's preflight."""
    if isinstance(model, str) and (model in defaults.MODELS or ENTRY_POINT.match(model)):
        return None
    return (
        f"model must be one of the built-in models {', '.join(defaults.MODELS)} or a Python entry "
        f"point 'package.module:function' (a function (input_shape, num_classes) -> Keras "
        f"model), got {model!r}"
    )


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


@dataclass(frozen=True)
class TrainConfig(Validated):
    """What one Horovod job trains, from where, to where, with how many processes.

    The job has ``workers x slots_per_worker`` ranks (`world_size`). `output` receives
    ``run_summary.json``, ``tensorboard/`` and, unless overridden, ``checkpoints/`` and the
    SavedModel in ``model/``.
    """

    what = "training parameters"

    data: str = param(
        help="dataset directory written by data prep", pipeline=False, check=nonempty_problem
    )
    output: str = param(
        help="run_summary.json, tensorboard/ (and checkpoints/, model/)",
        pipeline=False,
        check=nonempty_problem,
    )
    workers: int = param(
        defaults.WORKERS,
        "Horovod processes (local backend) or worker pods (MPIJob or TrainJob)",
        minimum=1,
    )
    slots_per_worker: int = param(
        defaults.SLOTS_PER_WORKER, "ranks per worker pod (MPIJob; 1 locally)", minimum=1
    )
    epochs: int = param(defaults.EPOCHS, "epochs to train", minimum=1)
    batch_size_per_worker: int = param(
        defaults.BATCH_SIZE_PER_WORKER,
        "batch per rank; the global batch is this x ranks",
        minimum=1,
    )
    learning_rate: float = param(
        defaults.BASE_LEARNING_RATE,
        "Adam's learning rate for one rank (lr_scaling scales it)",
        above=0,
        maximum=10,
    )
    warmup_epochs: int = param(defaults.WARMUP_EPOCHS, "epochs of learning-rate warmup", minimum=0)
    lr_scaling: str = param(
        defaults.LR_SCALING,
        "how Adam follows the world size: linear, sqrt or none",
        choices=LR_SCALINGS,
    )
    threads_per_worker: int = param(0, "CPU threads per rank (0: cores / local ranks)", minimum=0)
    model: str = param(
        defaults.MODEL,
        f"{', '.join(defaults.MODELS[:-1])} or {defaults.MODELS[-1]} (for larger colour "
        "images), or a Python entry point package.module:function "
        "(called as function(input_shape, num_classes); returns a Keras model)",
        check=model_problem,
    )
    augment: bool = param(
        defaults.AUGMENT, "augment the training images (rotation, shifts, shear, zoom)"
    )
    min_workers: int = param(
        0,
        "0: static (losing a worker ends the job); N > 0: elastic, it goes on with as few as "
        "N workers and grows back to workers",
        minimum=0,
    )
    mixed_precision: bool = param(
        False,
        "Keras's mixed_float16: float16 compute, float32 weights, the loss scaled (every rank "
        "skips an overflowed step alike); for GPUs with float16 units, slow on CPUs",
    )
    gpus_per_worker: int = param(
        0,
        "0: train on the CPU; N > 0: every rank trains on a GPU of its own, or the job stops "
        "before training",
        minimum=0,
    )
    seed: int = param(
        defaults.SHUFFLE_SEED, "initial weights and sample order", pipeline=False, minimum=0
    )
    model_dir: str | None = param(None, "SavedModel export (default OUTPUT/model)", pipeline=False)
    checkpoint_dir: str | None = param(None, "default OUTPUT/checkpoints", pipeline=False)

    @staticmethod
    def joint_problems(p: Mapping[str, Any]) -> list[str]:
        """The rules across the trainer's fields, each checked only when its fields are present."""
        problems = []
        workers, slots = _int(p.get("workers")), _int(p.get("slots_per_worker")) or 1
        minimum, gpus = _int(p.get("min_workers")), _int(p.get("gpus_per_worker"))
        if minimum and workers is not None and minimum > workers:
            problems.append(
                "min_workers must be <= workers (the most workers an elastic job runs with), got "
                f"{minimum} > {workers}"
            )
        if gpus and gpus > 0 and gpus < slots:
            problems.append(
                f"gpus_per_worker must be 0 (CPU) or >= slots_per_worker (each of a worker's ranks "
                f"trains on a GPU of its own), got {gpus} < {slots}"
            )
        if p.get("lr_scaling") == "sqrt" and workers and workers * slots > SQRT_MAX_WORLD_SIZE:
            problems.append(
                f"lr_scaling 'sqrt' works for at most {SQRT_MAX_WORLD_SIZE} ranks (it sets Adam's "
                f"beta_1 = 1 - ranks x 0.1), got {workers * slots}"
            )
        return problems

    @property
    def world_size(self) -> int:
        return self.workers * self.slots_per_worker

    @property
    def elastic(self) -> bool:
        """Whether the job is elastic: it survives losing workers down to `min_workers`."""
        return self.min_workers > 0

    @property
    def min_world_size(self) -> int:
        """The fewest ranks the job trains with: `world_size`, or min_workers x slots if elastic."""
        return self.min_workers * self.slots_per_worker if self.elastic else self.world_size

    @property
    def model_uri(self) -> str:
        return self.model_dir or storage.join(self.output, "model")

    @property
    def checkpoint_uri(self) -> str:
        """Where rank 0 writes one checkpoint per epoch."""
        return self.checkpoint_dir or storage.join(self.output, "checkpoints")

    @property
    def tensorboard_uri(self) -> str:
        """TensorBoard's log directory: rank 0's epochs (``train/``), evaluation's metrics."""
        return storage.join(self.output, "tensorboard")

    @property
    def summary_uri(self) -> str:
        return storage.join(self.output, "run_summary.json")


# Each field is declared once (`components.common.declare.param`: default, help, rule): the
# pipeline parameter of the same name, the train step's input, the check step's rule, the trainer
# flag ``--<name-with-dashes>``. Every way of starting the trainer (the local launcher, the cluster
# jobs, the benchmarks) turns a `TrainConfig` into argv with `to_argv`; every rank turns it back
# with `from_argv`, and the rules are checked once, when the `TrainConfig` is made.


def to_argv(config: TrainConfig) -> list[str]:
    """The trainer's command-line arguments for `config` (`from_argv` reads them back): every
    field that is required or differs from its default, as ``--<name> VALUE`` (a switch:
    ``--<name>`` or ``--no-<name>``)."""
    args: list[str] = []
    for p in TrainConfig.parameters():
        value = getattr(config, p.name)
        if not p.required and value == p.default:
            continue
        if p.type is bool:
            args.append(p.flag if value else "--no-" + p.flag[2:])
        else:
            args += [p.flag, repr(float(value)) if p.type is float else str(value)]
    return args


def from_argv(argv: list[str] | None = None) -> TrainConfig:
    """Parse the trainer's command line (one option per declared field) into a checked
    TrainConfig; a bad command line exits 2 naming the flag."""
    result = run_command(trainer_command, argv, "python -m components.train.rank")
    if not isinstance(result, TrainConfig):
        raise SystemExit(result)
    return result


@click.command(help="Train one model as one Horovod job (every rank gets the same arguments).")
@declared_options(TrainConfig.parameters(), choices=False)
def trainer_command(**values: Any) -> TrainConfig:
    try:
        return TrainConfig(**values)
    except InputError as exc:
        raise click.UsageError(str(exc)) from None


# Keras' Adam defaults: the single-worker settings every lr_scaling rule starts from.
BETA_1, BETA_2, EPSILON = 0.9, 0.999, 1e-7


def adam_settings(rule: str, learning_rate: float, k: int) -> dict[str, float]:
    """Adam's settings for a world of `k` ranks, whose steps take a batch k times one rank's:

    - ``linear``: learning rate x k (Goyal et al. 2017, the rule Horovod's examples use);
    - ``sqrt``: the square-root rule for Adam of Malladi et al. (NeurIPS 2022, arXiv
      2205.10287): learning rate x sqrt(k), beta_1 <- 1 - k (1 - beta_1), beta_2 <- 1 - k
      (1 - beta_2), epsilon <- epsilon / sqrt(k);
    - ``none``: the single-worker settings, whatever k.

    `rule` is one of these: TrainConfig's declared rule for ``lr_scaling`` checked it.
    """
    if rule == "sqrt":
        return {
            "learning_rate": learning_rate * math.sqrt(k),
            "beta_1": 1 - k * (1 - BETA_1),
            "beta_2": 1 - k * (1 - BETA_2),
            "epsilon": EPSILON / math.sqrt(k),
        }
    scaled = learning_rate * k if rule == "linear" else learning_rate
    return {"learning_rate": scaled, "beta_1": BETA_1, "beta_2": BETA_2, "epsilon": EPSILON}
