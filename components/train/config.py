"""The trainer's contract: one `TrainConfig`, and the one pair of functions to and from argv.

Every way of starting the trainer (the local launcher, the MPIJob manifest, the benchmarks)
turns a `TrainConfig` into argv with `to_argv`; every rank turns it back with `from_argv`.
The fields carry the pipeline parameters' names; the flags are the trainer's CLI. (The train
step's KFP input for `model` alone has another name, ``architecture``: the step's output
artifact is already called ``model``.)

=======================  ======================  ========================================
TrainConfig field        pipeline parameter      trainer flag
=======================  ======================  ========================================
data                     (dataset artifact)      ``--data``
output                   (beside the model)      ``--output``
workers                  workers                 ``--expected-workers`` (x slots_per_worker)
slots_per_worker         slots_per_worker        ``--slots-per-worker`` (MPIJob; default 1)
epochs                   epochs                  ``--epochs``
batch_size_per_worker    batch_size_per_worker   ``--batch-size``
learning_rate            learning_rate           ``--learning-rate`` (before x world size)
warmup_epochs            warmup_epochs           ``--warmup-epochs``
threads_per_worker       threads_per_worker      ``--threads-per-worker`` (0: cores/local)
seed                     (default)               ``--seed``
model                    model                   ``--model`` (train step input: ``architecture``)
augment                  augment                 ``--augment`` (a switch; off by default)
model_dir                (model artifact)        ``--model-dir``
checkpoint_dir           (default)               ``--checkpoint-dir``
compression              (default)               ``--compression`` (none | fp16)
backward_passes_per_step (default)               ``--backward-passes-per-step``
jit_compile              (default)               ``--jit-compile`` (XLA; off unless given)
inter_op_threads         (default)               ``--inter-op-threads`` (0: min(2, intra))
min_workers              min_workers             ``--min-workers`` (0: static; > 0: elastic)
gpus_per_worker          gpus_per_worker         ``--gpus-per-worker`` (0: CPU; > 0: every rank
                                                 must train on a GPU of its own, or stop)
=======================  ======================  ========================================

The last four are the scaling levers of issue 10 (``bench/levers.py`` measures them); their
defaults keep the trainer as it was until a measurement justifies changing one.

``min_workers`` > 0 makes the job elastic (issue 11): it keeps training with as few as
``min_workers`` workers and grows back to ``workers``; see ``components.train.elastic``. Issue 11
asked for an ``--elastic`` switch beside the ``min_workers`` parameter; one flag under the
parameter's name says both (0 is static).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from components.common import storage
from components.common.defaults import (
    AUGMENT,
    BASE_LEARNING_RATE,
    BATCH_SIZE_PER_WORKER,
    EPOCHS,
    MODEL,
    MODELS,
    SHUFFLE_SEED,
    WARMUP_EPOCHS,
)
from components.common.params import parameter_problems

# The trainer flag of each field whose flag is not simply ``--field-name``.
FLAG_OF = {
    "workers": "--expected-workers",
    "batch_size_per_worker": "--batch-size",
}


@dataclass(frozen=True)
class TrainConfig:
    """What one Horovod job trains, from where, to where, with how many processes.

    The job has ``workers x slots_per_worker`` ranks (`world_size`). `output` receives
    ``run_summary.json`` and, unless overridden, ``checkpoints/`` and the SavedModel in
    ``model/``.
    """

    data: str
    output: str
    workers: int
    slots_per_worker: int = 1
    epochs: int = EPOCHS
    batch_size_per_worker: int = BATCH_SIZE_PER_WORKER
    learning_rate: float = BASE_LEARNING_RATE
    warmup_epochs: int = WARMUP_EPOCHS
    threads_per_worker: int = 0  # 0: cores / local workers
    seed: int = SHUFFLE_SEED
    model: str = MODEL  # a built-in model or a "package.module:function" entry point
    augment: bool = AUGMENT
    model_dir: str | None = None
    checkpoint_dir: str | None = None
    compression: str = "none"  # gradient compression on the wire: none | fp16
    backward_passes_per_step: int = 1  # local batches summed before each allreduce
    jit_compile: bool = False  # XLA for the model's step
    inter_op_threads: int = 0  # 0: min(2, intra-op threads), as before
    min_workers: int = 0  # 0: static; > 0: elastic, between min_workers and workers workers
    gpus_per_worker: int = 0  # > 0: every rank trains on a GPU of its own, or the job stops

    def __post_init__(self) -> None:
        problems = [f"{name} is empty" for name in ("data", "output") if not getattr(self, name)]
        problems += parameter_problems(
            {
                **self.numbers(),
                "model": self.model,
                "augment": self.augment,
                "compression": self.compression,
                "jit_compile": self.jit_compile,
            }
        )
        if problems:
            raise ValueError("invalid training parameters: " + "; ".join(problems))

    def numbers(self) -> dict[str, int | float]:
        """The numeric fields by name (what `components.common.params` checks)."""
        return {
            "workers": self.workers,
            "slots_per_worker": self.slots_per_worker,
            "epochs": self.epochs,
            "batch_size_per_worker": self.batch_size_per_worker,
            "learning_rate": self.learning_rate,
            "warmup_epochs": self.warmup_epochs,
            "threads_per_worker": self.threads_per_worker,
            "seed": self.seed,
            "backward_passes_per_step": self.backward_passes_per_step,
            "inter_op_threads": self.inter_op_threads,
            "min_workers": self.min_workers,
            "gpus_per_worker": self.gpus_per_worker,
        }

    @property
    def world_size(self) -> int:
        """The Horovod world size: workers x slots per worker (``--expected-workers``)."""
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
        """Where the single SavedModel is exported."""
        return self.model_dir or storage.join(self.output, "model")

    @property
    def checkpoint_uri(self) -> str:
        """Where rank 0 writes one checkpoint per epoch."""
        return self.checkpoint_dir or storage.join(self.output, "checkpoints")

    @property
    def summary_uri(self) -> str:
        """Where rank 0 writes ``run_summary.json``."""
        return storage.join(self.output, "run_summary.json")


def to_argv(config: TrainConfig) -> list[str]:
    """The trainer's command-line arguments for `config` (`from_argv` reads them back)."""
    args = [
        "--data", config.data,
        "--output", config.output,
        "--expected-workers", str(config.world_size),
        "--epochs", str(config.epochs),
        "--batch-size", str(config.batch_size_per_worker),
        "--learning-rate", repr(float(config.learning_rate)),
        "--warmup-epochs", str(config.warmup_epochs),
        "--seed", str(config.seed),
        "--model", config.model,
    ]  # fmt: skip
    if config.augment:
        args.append("--augment")
    if config.slots_per_worker != 1:
        args += ["--slots-per-worker", str(config.slots_per_worker)]
    if config.threads_per_worker:
        args += ["--threads-per-worker", str(config.threads_per_worker)]
    if config.model_dir:
        args += ["--model-dir", config.model_dir]
    if config.checkpoint_dir:
        args += ["--checkpoint-dir", config.checkpoint_dir]
    if config.compression != "none":
        args += ["--compression", config.compression]
    if config.backward_passes_per_step != 1:
        args += ["--backward-passes-per-step", str(config.backward_passes_per_step)]
    if config.jit_compile:
        args += ["--jit-compile"]
    if config.inter_op_threads:
        args += ["--inter-op-threads", str(config.inter_op_threads)]
    if config.min_workers:
        args += ["--min-workers", str(config.min_workers)]
    if config.gpus_per_worker:
        args += ["--gpus-per-worker", str(config.gpus_per_worker)]
    return args


def argument_parser() -> argparse.ArgumentParser:
    """The trainer's argparse parser (flags as in the module docstring)."""
    p = argparse.ArgumentParser(
        prog="python -m components.train",
        description="Train one model as one Horovod job (every rank gets the same arguments).",
    )
    p.add_argument("--data", required=True, help="dataset directory written by data prep")
    p.add_argument("--output", required=True, help="run_summary.json (and checkpoints/, model/)")
    p.add_argument("--model-dir", default=None, help="SavedModel export (default OUTPUT/model)")
    p.add_argument("--checkpoint-dir", default=None, help="default OUTPUT/checkpoints")
    p.add_argument(
        "--expected-workers",
        type=int,
        required=True,
        help="the world size this job must have (elastic: the most); a mismatch stops every "
        "process at once",
    )
    p.add_argument("--slots-per-worker", type=int, default=1, help="ranks per worker host")
    p.add_argument("--epochs", type=int, default=EPOCHS)
    p.add_argument("--batch-size", type=int, default=BATCH_SIZE_PER_WORKER, help="per worker")
    p.add_argument(
        "--learning-rate", type=float, default=BASE_LEARNING_RATE, help="before scaling by workers"
    )
    p.add_argument("--warmup-epochs", type=int, default=WARMUP_EPOCHS)
    p.add_argument("--threads-per-worker", type=int, default=0, help="0: cores / local workers")
    p.add_argument("--seed", type=int, default=SHUFFLE_SEED)
    p.add_argument(
        "--model",
        default=MODEL,
        help=f"{' or '.join(MODELS)}, or a Python entry point package.module:function "
        "(called as function(input_shape, num_classes); returns a Keras model)",
    )
    p.add_argument(
        "--augment",
        action="store_true",
        default=AUGMENT,
        help="augment the training images (rotation, shifts, shear, zoom; training only)",
    )
    p.add_argument("--compression", default="none", help="gradient compression: none | fp16")
    p.add_argument(
        "--backward-passes-per-step", type=int, default=1, help="local batches per allreduce"
    )
    p.add_argument("--jit-compile", action="store_true", help="compile the step with XLA")
    p.add_argument("--inter-op-threads", type=int, default=0, help="0: min(2, intra-op threads)")
    p.add_argument(
        "--min-workers",
        type=int,
        default=0,
        help="0: static (losing a rank ends the job); N > 0: elastic, training on as few as N "
        "workers (--expected-workers is then the most); start it with elastic horovodrun",
    )
    p.add_argument(
        "--gpus-per-worker",
        type=int,
        default=0,
        help="0: train on the CPU; N > 0: every rank trains on a GPU of its own, and the job "
        "stops before training if one cannot (a CPU image, no GPU, too few GPUs)",
    )
    return p


def from_argv(argv: list[str] | None = None) -> TrainConfig:
    """Parse the trainer's command line into a checked TrainConfig (exits 2 naming the flag)."""
    p = argument_parser()
    a = vars(p.parse_args(argv))
    world, slots = a.pop("expected_workers"), a["slots_per_worker"]
    a["batch_size_per_worker"] = a.pop("batch_size")
    flags = {name: FLAG_OF.get(name, "--" + name.replace("_", "-")) for name in a}
    flags["workers"] = FLAG_OF["workers"]
    problems = parameter_problems({**a, "workers": world}, flags)
    if not problems and world % slots:
        problems = [f"--expected-workers {world} is not a multiple of --slots-per-worker {slots}"]
    try:
        if problems:
            raise ValueError("; ".join(problems))
        return TrainConfig(workers=world // slots, **a)
    except ValueError as exc:
        p.error(str(exc))
        raise  # unreachable: p.error exits
