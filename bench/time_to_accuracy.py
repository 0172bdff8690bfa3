"""Time to accuracy: what does a second worker buy, and which learning-rate rule gets there first?

Variants, interleaved, each the project's trainer (its default model) at the default launcher,
``--seeds`` distinct seeds each (3: 1, 2, 3; the seed sets the initial weights and the order):

- ``1x1`` (1 process x 1 thread), ``1x2`` (1 process x 2 threads: the same cores as 2x1) and
  ``2x1`` (our job, 2 ranks x 1 thread) at the default ``lr_scaling`` (linear);
- ``2x1_sqrt``, ``2x1_none``: the other ``lr_scaling`` rules at 2 ranks;
- ``2x1_adadelta``: a reference row, the seed example's rule (Horovod's keras_mnist_advanced.py:
  Adadelta at learning rate 1.0 x ranks, warmed up over 5 epochs; `bench.variants`).

Rank 0 saves its weights ``--per-epoch`` times an epoch (`bench.variants`); each snapshot is
scored on the 1,000 real held-out digits after the job, outside the timed path, and the time
the saving took is taken off both clocks: ``training`` (from the first step) and ``wall`` (from
launch, process start included). For each target (95%, 96%, 97%) and variant: the first
snapshot at or above it, per seed, then the median and the range. A target within two standard
errors of the 1x1 runs' final accuracy (sqrt(p (1 - p) / n) of n test digits), or above it, is
"at the plateau": reaching it is luck, so it decides nothing.

The speed-ups are 2x1 against 1x1 and against 1x2 (medians of training time, then wall time).
The rules are ranked by their median training time to 96%; a rule can be adopted only if its
mean final test accuracy is within ``--tolerance`` (0.002) of the linear rule's.
"""

from __future__ import annotations

import functools
import json
import math
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from bench.common import (
    bench_dataset,
    bench_main,
    bench_options,
    interleave,
    machine_state,
    median,
    ratio,
    run_trainer,
    scratch,
    trainer_args,
    write_result,
)
from bench.variants import SNAPSHOTS_FILE
from components.common.defaults import EPOCHS, MODEL

NAME = "time_to_accuracy"
TARGETS = (0.95, 0.96, 0.97)
VERDICT_TARGET = 0.96


@dataclass(frozen=True)
class Variant:
    """A layout and learning-rate rule: its trainer fields and `bench.variants` flags."""

    name: str
    workers: int
    threads: int
    fields: tuple[tuple[str, Any], ...] = ()
    flags: tuple[str, ...] = ()


VARIANTS = (
    Variant("1x1", 1, 1),
    Variant("1x2", 1, 2),
    Variant("2x1", 2, 1),
    Variant("2x1_sqrt", 2, 1, (("lr_scaling", "sqrt"),)),
    Variant("2x1_none", 2, 1, (("lr_scaling", "none"),)),
    Variant(
        "2x1_adadelta", 2, 1, (("learning_rate", 1.0), ("warmup_epochs", 5)),
        ("--optimizer", "adadelta"),
    ),
)  # fmt: skip
RULES = {"linear": "2x1", "sqrt": "2x1_sqrt", "none": "2x1_none", "adadelta": "2x1_adadelta"}


@dataclass(frozen=True)
class Setup:
    """What every job of one benchmark run shares."""

    data: str
    work: Path
    epochs: int
    per_epoch: int


def score(snapshots: Path, data: str, seed: int) -> list[dict[str, float]]:
    """Each snapshot's test accuracy on the held-out digits, with its clocks."""
    import numpy as np

    from components.common import dataset, keras_env
    from components.common.shard_files import read_split_arrays
    from components.train.rank.model import build_model

    manifest = dataset.read_manifest(data)
    images, labels = read_split_arrays(keras_env.tensorflow(), manifest, "test")
    model = build_model(seed, MODEL)
    curve = []
    for snap in json.loads((snapshots / SNAPSHOTS_FILE).read_text()):
        model.load_weights(str(snapshots / snap["weights"]))
        predicted = np.argmax(model.predict(images, batch_size=500, verbose=0), axis=1)
        curve.append({**snap, "accuracy": float(np.mean(predicted == labels))})
    return curve


def measure(setup: Setup, variant: Variant, seed: int, r: int) -> dict[str, Any]:
    """One job of `variant` with `seed`, its snapshots scored."""
    out = setup.work / f"{variant.name}-s{seed}"
    fields = dict(variant.fields)
    args = trainer_args(
        setup.data, out / "run", variant.workers, setup.epochs, variant.threads, seed=seed,
        **fields,
    )  # fmt: skip
    flags = [*variant.flags, "--snapshots", str(out / "snapshots"), "--per-epoch"]
    launched = time.time()
    job, summary = run_trainer(
        variant.workers, [*flags, str(setup.per_epoch), "--", *args], module="bench.variants"
    )
    curve = score(out / "snapshots", setup.data, seed)
    for point in curve:
        point["wall_seconds"] = point.pop("wall_time") - launched
    return {"seed": seed, "curve": curve, "final_accuracy": curve[-1]["accuracy"],
            "job_wall_seconds": round(job.wall_seconds, 2)}  # fmt: skip


def seeded(setup: Setup, variant: Variant, r: int) -> dict[str, Any]:
    """Round `r`'s job of `variant`: seed r + 1 (the same seed for every variant)."""
    return measure(setup, variant, r + 1, r)


def first_reaching(curve: list[dict[str, float]], target: float) -> dict[str, float] | None:
    """The first snapshot at or above `target` (None if none)."""
    return next((p for p in curve if p["accuracy"] >= target), None)


def reached(runs: list[dict[str, Any]], target: float) -> dict[str, Any]:
    """Per seed, when `target` was first reached; median and range of both clocks."""
    hits = [first_reaching(run["curve"], target) for run in runs]
    out: dict[str, Any] = {"reached": sum(h is not None for h in hits), "of": len(hits)}
    for clock in ("training_seconds", "wall_seconds"):
        values = [h[clock] for h in hits if h is not None]
        out[clock] = [round(h[clock], 1) if h else None for h in hits]
        if values and len(values) == len(hits):
            out[f"median_{clock}"] = round(median(values), 1)
            out[f"range_{clock}"] = [round(min(values), 1), round(max(values), 1)]
    out["epochs"] = [round(h["epoch"], 2) if h else None for h in hits]
    return out


def plateau(runs_1x1: list[dict[str, Any]], test_digits: int) -> dict[str, Any]:
    """The 1x1 runs' final accuracy, its standard error, and the targets at the plateau."""
    final = statistics.fmean(r["final_accuracy"] for r in runs_1x1)
    se = math.sqrt(final * (1 - final) / test_digits)
    at = [t for t in TARGETS if t >= final - 2 * se]
    return {"final_accuracy_1x1": round(final, 4), "standard_error": round(se, 4),
            "targets_at_plateau": at}  # fmt: skip


def speedups(times: dict[str, dict[float, dict[str, Any]]], at_plateau: list[float]) -> dict:
    """2x1 against 1x1 and against 1x2 per target, on medians of training and of wall time."""
    out: dict[str, Any] = {}
    for target in TARGETS:
        row: dict[str, Any] = {"at_plateau": target in at_plateau}
        for other in ("1x1", "1x2"):
            for clock in ("training_seconds", "wall_seconds"):
                mine = times["2x1"][target].get(f"median_{clock}", float("nan"))
                theirs = times[other][target].get(f"median_{clock}", float("nan"))
                row[f"2x1_vs_{other}_{clock.split('_')[0]}"] = ratio(theirs, mine)
        out[f"{target:.2f}"] = row
    return out


def rules(times: dict[str, Any], runs: dict[str, list[dict]], tolerance: float) -> dict:
    """Each lr rule: median training time to 96%, mean final accuracy, whether it keeps
    accuracy, and the one to adopt (the fastest that keeps accuracy)."""
    linear = statistics.fmean(r["final_accuracy"] for r in runs["2x1"])
    table = {}
    for rule, name in RULES.items():
        if name not in runs:
            continue
        final = statistics.fmean(r["final_accuracy"] for r in runs[name])
        table[rule] = {
            "median_training_seconds_to_96": times[name][VERDICT_TARGET].get(
                "median_training_seconds"
            ),
            "final_accuracy_mean": round(final, 4),
            "keeps_accuracy": final >= linear - tolerance,
        }
    eligible = {k: v for k, v in table.items() if k != "adadelta" and v["keeps_accuracy"]}
    timed = {k: v for k, v in eligible.items() if v["median_training_seconds_to_96"] is not None}
    best = min(timed, key=lambda k: timed[k]["median_training_seconds_to_96"]) if timed else None
    return {"rules": table, "adopt": best}


@click.command(help=__doc__)
@bench_options
@click.option("--variants", default=",".join(v.name for v in VARIANTS), show_default=True)
@click.option("--train-samples", type=int, default=8000, show_default=True)
@click.option("--epochs", type=int, default=EPOCHS, show_default=True)
@click.option(
    "--per-epoch", type=int, default=4, show_default=True, help="snapshots scored per epoch"
)
@click.option("--tolerance", type=float, default=0.002, show_default=True)
def command(
    out: Path,
    work: Path | None,
    repeats: int,  # the seeds
    quick: bool,
    variants: str,
    train_samples: int,
    epochs: int,
    per_epoch: int,
    tolerance: float,
) -> int:
    if quick:
        train_samples, epochs, repeats, per_epoch = 600, 2, 1, 2
    chosen = [v for v in VARIANTS if v.name in variants.split(",")]
    scratch_dir = scratch(work, NAME)
    setup = Setup(bench_dataset(scratch_dir, train_samples), scratch_dir, epochs, per_epoch)
    machine_before = machine_state()
    seeded_runs = {v.name: functools.partial(seeded, setup, v) for v in chosen}
    runs = interleave(seeded_runs, repeats)
    times = {name: {t: reached(rs, t) for t in TARGETS} for name, rs in runs.items()}
    result: dict[str, Any] = {
        "settings": {
            "model": MODEL, "train_samples": train_samples, "epochs": epochs,
            "seeds": list(range(1, repeats + 1)), "snapshots_per_epoch": per_epoch,
            "targets": list(TARGETS), "test_digits": 1000,
        },
        "machine_before": machine_before,
        "runs": runs,
        "times": {name: {f"{t:.2f}": v for t, v in row.items()} for name, row in times.items()},
    }  # fmt: skip
    if "1x1" in runs:
        result["plateau"] = plateau(runs["1x1"], 1000)
        if {"1x2", "2x1"} <= set(runs):
            result["speedups"] = speedups(times, result["plateau"]["targets_at_plateau"])
    if "2x1" in runs:
        result.update(rules(times, runs, tolerance))
    write_result(NAME, result, out)
    print(json.dumps({k: result.get(k) for k in ("plateau", "speedups", "adopt")}, indent=1))
    return 0


def main(argv: list[str] | None = None) -> int:
    """CLI: ``python -m bench.time_to_accuracy [--variants 1x1,2x1] [--repeats 3]`` (the seeds)."""
    return bench_main(command, argv, "bench.time_to_accuracy")


if __name__ == "__main__":
    sys.exit(main())
