"""Time to accuracy: what does a second worker buy? And does the sampling matter?

Variants, side by side and interleaved, each the project's real trainer (its default model,
or ``--model``) under horovodrun:

- ``1x1``: 1 process x 1 thread.
- ``1x2``: 1 process x 2 threads (the same cores as ``2x1``, one process).
- ``2x1``: our job, 2 ranks x 1 thread (one model).
- ``two_copies`` (only if asked, ``--variants``): the original report's failure mode: 2
  independent ``horovodrun -np 1`` jobs at once, each on the full data (same resources as
  ``2x1``, twice the work, two models). Its time is that of the first copy to reach the target.

The speed-ups reported are 2x1 against 1x1 and against 1x2.

Every epoch's checkpoint is scored on the 1,000 real held-out test digits; the time to
accuracy is from launch to the first checkpoint at or above ``--target`` (``wall``), and from
the trainer's start-of-training log line to it (``training``, which leaves out process start).

Sampling: after ``--sampling-epochs`` epochs at 2 ranks, test accuracy of the 2019 example's
sampling (each rank draws random batches from the full set, ``len/N`` steps) against our
exact disjoint shards, over ``--repeats`` seeds.
"""

from __future__ import annotations

import functools
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.checkpoint_watch import CheckpointWatcher, EpochMark, first_reaching, score_checkpoints
from bench.common import (
    JobResult,
    RunningJob,
    add_model_option,
    base_parser,
    bench_dataset,
    collect,
    default_model,
    horovod_command,
    interleave,
    local_job_env,
    machine_state,
    median,
    model_fields,
    ratio,
    run_job,
    scratch,
    start_job,
    trainer_args,
    write_result,
)
from components.common.defaults import BATCH_SIZE_PER_WORKER, SHUFFLE_SEED

NAME = "time_to_accuracy"
START_LINE = "ONE Horovod job"
# variant: (independent jobs at once, ranks per job, threads per rank)
VARIANTS: dict[str, tuple[int, int, int]] = {
    "1x1": (1, 1, 1),
    "1x2": (1, 1, 2),
    "2x1": (1, 2, 1),
    "two_copies": (2, 1, 1),
}
DEFAULT_VARIANTS = "1x1,1x2,2x1"


@dataclass(frozen=True)
class Run:
    """What every timed job of one benchmark run shares."""

    data: str
    work: Path
    epochs: int
    target: float
    model: str | None


def _launch_watched(
    run: Run, output: Path, workers: int, threads: int
) -> tuple[RunningJob, CheckpointWatcher, float]:
    args = trainer_args(
        run.data, output, workers, run.epochs, threads=threads, **model_fields(run.model)
    )
    watcher = CheckpointWatcher(output / "checkpoints", output / "kept").start()
    started_wall = time.time()
    job = start_job(horovod_command(workers, "components.train", args), local_job_env(workers))
    return job, watcher, started_wall


def _reached(
    job: JobResult, watcher: CheckpointWatcher, started_wall: float, run: Run
) -> dict[str, Any]:
    scored = score_checkpoints(watcher.stop(), run.data, model_name=run.model)
    hit = first_reaching(scored, run.target)
    train_start = job.first_time(START_LINE) or 0.0
    out: dict[str, Any] = {
        "curve": [
            {"epoch": e, "seconds": round(t - started_wall, 3), "test_accuracy": a}
            for e, t, a in scored
        ],
        "reached": hit is not None,
        "wall_seconds_total": round(job.wall_seconds, 2),
    }
    if hit:
        wall = hit["wall_time"] - started_wall
        out.update(
            epoch=hit["epoch"],
            wall_seconds=round(wall, 3),
            training_seconds=round(wall - train_start, 3),
        )
    return out


def measure_jobs(run: Run, variant: str, round_no: int) -> dict[str, Any]:
    """Launch the variant's identical jobs at once; time each to the target accuracy."""
    jobs, workers, threads = VARIANTS[variant]
    launched = [
        _launch_watched(run, run.work / f"{variant}-r{round_no}-{i}", workers, threads)
        for i in range(jobs)
    ]
    results = [collect(job) for job, _, _ in launched]
    per_job = [
        _reached(job, watcher, started_wall, run)
        for job, (_, watcher, started_wall) in zip(results, launched, strict=True)
    ]
    hits = [j for j in per_job if j["reached"]]
    best = min(hits, key=lambda j: j["wall_seconds"]) if hits else None
    return {
        "jobs": per_job,
        "reached": best is not None,
        "wall_seconds": best["wall_seconds"] if best else float("nan"),
        "training_seconds": best["training_seconds"] if best else float("nan"),
        "epoch": best["epoch"] if best else None,
    }


def measure_sampling(run: Run, module: str, label: str, epochs: int, seed: int) -> dict[str, Any]:
    """Test accuracy after `epochs` epochs at 2 ranks with the given rank program."""
    output = run.work / f"{label}-s{seed}"
    args = trainer_args(
        run.data, output, 2, epochs, threads=1, seed=seed, **model_fields(run.model)
    )
    run_job(horovod_command(2, module, args), local_job_env(2))
    summary = json.loads((output / "run_summary.json").read_text())
    last = output / "checkpoints" / f"epoch-{epochs:04d}"
    scored = score_checkpoints([EpochMark(epochs, 0.0, last)], run.data, seed, run.model)
    return {
        "seed": seed,
        "test_accuracy": scored[0][2],
        "coverage": summary["coverage"],
    }


def run(
    train_samples: int,
    epochs: int,
    target: float,
    sampling_epochs: int,
    repeats: int,
    work: Path,
    model: str | None = None,
    variants: tuple[str, ...] = tuple(DEFAULT_VARIANTS.split(",")),
) -> dict[str, Any]:
    """Both comparisons, interleaved, `repeats` rounds each."""
    timed = Run(bench_dataset(work, train_samples), work, epochs, target, model)
    machine_before = machine_state()
    runs = interleave({v: functools.partial(measure_jobs, timed, v) for v in variants}, repeats)
    wall = {k: median([r["wall_seconds"] for r in v]) for k, v in runs.items()}
    training = {k: median([r["training_seconds"] for r in v]) for k, v in runs.items()}
    sampling = interleave(
        {
            "disjoint_shards": lambda r: measure_sampling(
                timed, "components.train", "disjoint", sampling_epochs, SHUFFLE_SEED + r
            ),
            "random_2019": lambda r: measure_sampling(
                timed, "bench.sampling_2019", "random2019", sampling_epochs, SHUFFLE_SEED + r
            ),
        },
        repeats,
    )
    accuracy = {k: median([r["test_accuracy"] for r in v]) for k, v in sampling.items()}
    return {
        "settings": {
            "model": model or default_model(),
            "variants": {
                v: dict(zip(("jobs", "ranks", "threads"), VARIANTS[v], strict=True))
                for v in variants
            },
            "train_samples": train_samples,
            "test_samples": "1,000 real held-out digits",
            "target_test_accuracy": target,
            "max_epochs": epochs,
            "batch_size_per_worker": BATCH_SIZE_PER_WORKER,
            "repeats": repeats,
            "sampling_epochs": sampling_epochs,
        },
        "machine_before": machine_before,
        "runs": runs,
        "median_wall_seconds_to_target": wall,
        "median_training_seconds_to_target": training,
        "speedup_wall": speedups(wall),
        "speedup_training": speedups(training),
        "sampling_runs": sampling,
        "sampling_median_test_accuracy": accuracy,
        "sampling_accuracy_difference": round(
            accuracy["disjoint_shards"] - accuracy["random_2019"], 4
        ),
    }


def speedups(seconds: dict[str, float]) -> dict[str, float]:
    """``2x1_vs_1x1`` = t(1x1) / t(2x1) (above 1: the 2x1 job is faster), and so on for the
    variants measured."""
    pairs = [("2x1", "1x1"), ("2x1", "1x2"), ("1x2", "1x1"), ("2x1", "two_copies"),
             ("two_copies", "1x1")]  # fmt: skip
    return {
        f"{fast}_vs_{slow}": ratio(seconds[slow], seconds[fast])
        for fast, slow in pairs
        if fast in seconds and slow in seconds
    }


def main(argv: list[str] | None = None) -> int:
    """CLI: ``python -m bench.time_to_accuracy [--target 0.97] [--model NAME]``."""
    p = base_parser(__doc__ or NAME)
    p.add_argument("--train-samples", type=int, default=8000)
    p.add_argument("--epochs", type=int, default=8, help="epochs each run may use")
    p.add_argument("--target", type=float, default=0.97, help="test accuracy to reach")
    p.add_argument("--sampling-epochs", type=int, default=2)
    p.add_argument("--variants", default=DEFAULT_VARIANTS, help=f"of {', '.join(VARIANTS)}")
    add_model_option(p)
    a = p.parse_args(argv)
    variants = tuple(v for v in a.variants.split(",") if v)
    if unknown := sorted(set(variants) - set(VARIANTS)):
        p.error(f"unknown variants {unknown}; known: {', '.join(VARIANTS)}")
    if a.quick:
        a.train_samples, a.epochs, a.target, a.sampling_epochs, a.repeats = 600, 2, 0.1, 1, 1
    result = run(
        a.train_samples, a.epochs, a.target, a.sampling_epochs, a.repeats, scratch(a.work, NAME),
        a.model, variants,
    )  # fmt: skip
    write_result(NAME, result, a.out)
    print(
        result["speedup_wall"], result["speedup_training"], result["sampling_median_test_accuracy"]
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
