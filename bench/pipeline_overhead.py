"""Pipeline overhead: where the wall time of ``make run`` goes.

Runs ``python -m pipeline run-local`` (what ``make run`` runs) and stamps every output line as
it arrives. kfp.local logs ``Executing task 'x'`` and ``Task 'x' finished``; the trainer logs
its start-of-training line and one checkpoint line per epoch. From those:

- each task's wall time, and orchestration (process start, kfp.local between tasks, exit);
- training proper: from the trainer's ``ONE Horovod job`` line to its last epoch checkpoint;
- the share of the total that is *not* training (target: under 15%).
"""

from __future__ import annotations

import functools
import re
import sys
from pathlib import Path
from typing import Any

import click

from bench.common import (
    bench_main,
    bench_options,
    interleave,
    machine_state,
    median,
    ratio,
    scratch,
    write_result,
)
from components.common.defaults import EPOCHS
from standins.commands import CommandResult, run_to_end

NAME = "pipeline_overhead"
ANSI = re.compile(r"\x1b\[[0-9;]*m")
EXECUTING = re.compile(r"Executing task '([^']+)'")
FINISHED = re.compile(r"Task '([^']+)' finished with status")
TRAINING_START = "ONE Horovod job"
EPOCH_CHECKPOINT = re.compile(r"checkpoint after epoch \d+ written")


def segments(result: CommandResult) -> dict[str, Any]:
    """Task times, orchestration and training proper from one run's stamped output."""
    lines = [(t - result.started, ANSI.sub("", line)) for t, line in result.lines]
    tasks: dict[str, float] = {}
    starts: dict[str, float] = {}
    training_start = training_end = None
    for t, line in lines:
        if m := EXECUTING.search(line):
            starts[m.group(1)] = t
        elif (m := FINISHED.search(line)) and m.group(1) in starts:
            tasks[m.group(1)] = round(t - starts[m.group(1)], 3)
        elif TRAINING_START in line and training_start is None:
            training_start = t
        elif EPOCH_CHECKPOINT.search(line):
            training_end = t
    total = result.wall_seconds
    in_tasks = sum(tasks.values())
    training = (training_end - training_start) if training_start and training_end else 0.0
    train_task = next((v for k, v in tasks.items() if k.startswith("train")), 0.0)
    return {
        "total_seconds": round(total, 3),
        "task_seconds": tasks,
        "orchestration_seconds": round(total - in_tasks, 3),
        "training_seconds": round(training, 3),
        "train_task_seconds": train_task,
        "not_training_share": ratio(total - training, total),
        "not_train_task_share": ratio(total - train_task, total),
    }


def measure(root: Path, workers: int, flags: list[str], round_no: int) -> dict[str, Any]:
    """One ``python -m pipeline run-local FLAGS`` run, split into segments."""
    command = [
        sys.executable, "-m", "pipeline", "run-local", "--root", str(root / f"r{round_no}"),
        "--workers", str(workers), *flags,
    ]  # fmt: skip
    return segments(run_to_end(command, timeout_s=1200))


def summarise(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians over runs: total, each task, orchestration, training and the shares."""
    tasks = sorted({k for r in runs for k in r["task_seconds"]})
    total = median([r["total_seconds"] for r in runs])
    out: dict[str, Any] = {
        "total_seconds": total,
        "task_seconds": {k: median([r["task_seconds"].get(k, 0.0) for r in runs]) for k in tasks},
    }
    for key in ("orchestration_seconds", "training_seconds", "train_task_seconds"):
        out[key] = median([r[key] for r in runs])
    out["task_share"] = {k: ratio(v, total) for k, v in out["task_seconds"].items()}
    out["orchestration_share"] = ratio(out["orchestration_seconds"], total)
    out["not_training_share"] = median([r["not_training_share"] for r in runs])
    out["not_train_task_share"] = median([r["not_train_task_share"] for r in runs])
    out["not_training_seconds"] = round(total - out["training_seconds"], 3)
    # Training time at which the fixed rest would be 15% of the total, at this overhead.
    out["training_seconds_for_15_percent"] = round(out["not_training_seconds"] * 0.85 / 0.15, 1)
    return out


def run(configs: dict[str, list[str]], workers: int, repeats: int, work: Path) -> dict[str, Any]:
    """Each configuration (name -> extra run-local flags incl. --epochs), interleaved."""
    machine_before = machine_state()
    variants = {n: functools.partial(measure, work / n, workers, f) for n, f in configs.items()}
    return record(configs, workers, interleave(variants, repeats), machine_before)


def record(
    configs: dict[str, list[str]],
    workers: int,
    runs: dict[str, list[dict[str, Any]]],
    machine_before: dict[str, Any],
) -> dict[str, Any]:
    """The result of `runs` (name -> each run's `segments`) of `configs`, with their medians."""
    return {
        "settings": {
            "workers": workers,
            "configs": configs,
            "repeats": max(len(rs) for rs in runs.values()),
        },
        "machine_before": machine_before,
        "runs": runs,
        "medians": {name: summarise(rs) for name, rs in runs.items()},
    }


@click.command(help=__doc__)
@bench_options
@click.option("--workers", type=int, default=2, show_default=True)
@click.option(
    "--epochs", type=int, default=EPOCHS, show_default=True, help="the `make run` default"
)
@click.option(
    "--also-epochs", type=int, default=0, show_default=True, help="also a longer run (0: no)"
)
def command(
    out: Path,
    work: Path | None,
    repeats: int,
    quick: bool,
    workers: int,
    epochs: int,
    also_epochs: int,
) -> int:
    configs = {"default": ["--epochs", str(epochs)]}
    if also_epochs:
        configs[f"epochs_{also_epochs}"] = ["--epochs", str(also_epochs)]
    if quick:
        configs = {"quick": ["--epochs", "1", "--data-limit", "300", "--min-accuracy", "0"]}
        repeats = 1
    result = run(configs, workers, repeats, scratch(work, NAME))
    write_result(NAME, result, out)
    for name, m in result["medians"].items():
        print(name, m)
    return 0


def main(argv: list[str] | None = None) -> int:
    """CLI: ``python -m bench.pipeline_overhead [--epochs 8] [--also-epochs 24]``."""
    return bench_main(command, argv, "bench.pipeline_overhead")


if __name__ == "__main__":
    sys.exit(main())
