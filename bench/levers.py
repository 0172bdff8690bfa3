"""Which lever closes the 2x1 scaling gap? Each lever alone on the 2x1 job, side by side.

Three modes, each its own result file:

- throughput (default, ``levers.json``): the 2x1 job (2 ranks x 1 thread, batch 64 per
  worker, the trainer's default model or ``--model``) with each lever applied ONE AT A TIME,
  and the 1x1 and 1x2 reference layouts, all interleaved round by round. Per lever: its 2x1
  throughput against the plain 2x1 (``over_baseline_2x1``), ``ceiling_ratio`` =
  T(2x1) / T(1x2) and ``efficiency`` = T(2x1) / (2 T(1x1)). A lever that also changes a lone
  process (``alone_too``: inter-op threads, pinning, XLA, batch 128) gets its 1x1 and 1x2
  measured with it too, so its figures compare like with like.
- ``--accuracy`` (``levers_accuracy.json``): the levers that change the arithmetic (fp16,
  backward passes, XLA, batch 128) and the plain job, 2x1 at the trainer's default epochs,
  test accuracy of the exported model on the 1,000 real held-out digits, over ``--repeats``
  seeds (3): both reported, with ``keeps_accuracy`` (mean within ``--tolerance`` of the plain
  job's mean). Adopt a lever as a default only if it keeps accuracy.
- ``--profile`` (``levers_profile.json``): one profiled 2x1 run (``bench.step_profile``):
  the Horovod timeline and every thread's CPU per step, to see where the step goes.

Levers: environment variables of the job (``HOROVOD_CYCLE_TIME``, ``HOROVOD_FUSION_THRESHOLD``),
pinning (``bench.pin``) or trainer flags (``TrainConfig`` fields: ``compression``,
``backward_passes_per_step``, ``inter_op_threads``, ``jit_compile``, ``batch_size_per_worker``).
The learning rate rule is the trainer's: base x world size. Two levers of the first run were
adopted: ``HOROVOD_THREAD_AFFINITY`` is a launcher default (``launch.thread_affinity``; every
job here has it, as ``make run`` has), and batch 128 is the trainer's default; this benchmark
keeps the 2x1 job at batch 64, where the gap was measured, with ``batch_128`` as a lever.

    python -m bench.levers [--levers fp16,xla] [--accuracy | --profile] [--model NAME]
"""

from __future__ import annotations

import functools
import os
import statistics
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.common import (
    add_model_option,
    base_parser,
    bench_dataset,
    default_model,
    interleave,
    job_throughput,
    machine_state,
    median,
    model_fields,
    ratio,
    run_trainer,
    scratch,
    trainer_args,
    write_result,
)
from components.common.defaults import EPOCHS, SHUFFLE_SEED

NAME = "levers"
LAYOUTS = {"1x1": (1, 1), "1x2": (1, 2), "2x1": (2, 1)}
BATCH_SIZE = 64  # per worker: the batch the gap was measured at (as bench.scaling)


@dataclass(frozen=True)
class Lever:
    """One change to the 2x1 job, through its environment, pinning or trainer fields."""

    name: str
    what: str
    env: Mapping[str, str] = field(default_factory=dict)
    fields: Mapping[str, Any] = field(default_factory=dict)
    pin: bool = False
    alone_too: bool = False  # changes a lone process too: 1x1 and 1x2 measured with it
    accuracy: bool = False  # changes the arithmetic: tested for accuracy over seeds


BASELINE = Lever("baseline", "the trainer's defaults at batch 64 per worker")
LEVERS = (
    Lever("cycle_time_1ms", "HOROVOD_CYCLE_TIME=1 (ms; default 5)", {"HOROVOD_CYCLE_TIME": "1"}),
    # The other way: the background thread negotiates once per cycle, a Gloo collective each
    # time, so a longer cycle spends less CPU on the rank's shared cores (the profile's
    # horovod threads), at up to one cycle of latency per step.
    Lever("cycle_time_20ms", "HOROVOD_CYCLE_TIME=20", {"HOROVOD_CYCLE_TIME": "20"}),
    Lever(
        "fusion_off",
        "HOROVOD_FUSION_THRESHOLD=0: one allreduce per tensor (default 128 MB)",
        {"HOROVOD_FUSION_THRESHOLD": "0"},
    ),
    Lever("fusion_8mb", "HOROVOD_FUSION_THRESHOLD=8 MB", {"HOROVOD_FUSION_THRESHOLD": "8388608"}),
    Lever(
        "fp16",
        "gradients allreduced as float16 (hvd.Compression.fp16)",
        fields={"compression": "fp16"},
        accuracy=True,
    ),
    Lever(
        "backward_passes_2",
        "2 local batches per allreduce, averaged (backward_passes_per_step=2)",
        fields={"backward_passes_per_step": 2},
        accuracy=True,
    ),
    Lever(
        "inter_op_2",
        "2 TF inter-op threads per rank (default 1 at 1 intra-op thread)",
        fields={"inter_op_threads": 2},
        alone_too=True,
    ),
    Lever("pinned", "each rank pinned to its own cores (bench.pin)", pin=True, alone_too=True),
    Lever(
        "xla",
        "forward and backward pass compiled by XLA (--jit-compile)",
        fields={"jit_compile": True},
        alone_too=True,
        accuracy=True,
    ),
    Lever(
        "batch_128",
        "per-worker batch 128 (not 64); learning rate still base x world size",
        fields={"batch_size_per_worker": 128},
        alone_too=True,
        accuracy=True,
    ),
)
QUICK_LEVERS = "cycle_time_1ms,fp16"


@dataclass(frozen=True)
class Setup:
    """What every job of one benchmark run shares."""

    data: str
    work: Path
    epochs: int
    model: str | None


def variant_name(layout: str, lever: Lever) -> str:
    """``2x1`` for the plain job, ``2x1+fp16`` with a lever."""
    return layout if lever is BASELINE else f"{layout}+{lever.name}"


def lever_env(lever: Lever, workers: int) -> dict[str, str]:
    """The environment variables `lever` adds to a job of `workers` local ranks."""
    return dict(lever.env)


def score_model(model_dir: Path, data: str) -> float:
    """Accuracy of the exported model on the test split, as the pipeline's evaluate step."""
    from components.evaluate.evaluate import evaluate

    return round(evaluate(str(model_dir), data).accuracy, 4)


def measure(setup: Setup, layout: str, lever: Lever, seed: int, round_no: int) -> dict[str, Any]:
    """One job of `layout` with `lever`: throughput, and test accuracy of its model."""
    workers, threads = LAYOUTS[layout]
    output = setup.work / f"{variant_name(layout, lever)}-s{seed}-r{round_no}"
    fields = {"batch_size_per_worker": BATCH_SIZE, "seed": seed, **model_fields(setup.model)}
    args = trainer_args(
        setup.data, output, workers, setup.epochs, threads, **{**fields, **lever.fields}
    )
    pin = threads if lever.pin else 0
    job, summary = run_trainer(workers, args, env=lever_env(lever, workers), pin_threads=pin)
    return {
        "seed": seed,
        "examples_per_second": job_throughput(summary),
        "per_rank_examples_per_second": [r["examples_per_second"] for r in summary["per_rank"]],
        "steps_per_epoch": summary["per_rank"][0]["steps_per_epoch"],
        "wall_seconds": round(job.wall_seconds, 2),
        "final_train_accuracy": summary["final_metrics"].get("accuracy"),
        "test_accuracy": score_model(output / "model", setup.data),
    }


def figures(medians: Mapping[str, float], lever: Lever) -> dict[str, Any]:
    """A lever's 2x1 throughput against the plain 2x1, its ceiling ratio and efficiency.

    The references are the lever's own 1x1 and 1x2 where they were measured (``alone_too``),
    else the plain ones.
    """
    nan = float("nan")
    t = medians.get(variant_name("2x1", lever), nan)
    own = variant_name("1x1", lever) in medians
    ref = lever if own else BASELINE
    t11 = medians.get(variant_name("1x1", ref), nan)
    t12 = medians.get(variant_name("1x2", ref), nan)
    out: dict[str, Any] = {
        "examples_per_second_2x1": t,
        "over_baseline_2x1": ratio(t, medians.get("2x1", nan)),
        "ceiling_ratio": ratio(t, t12),
        "efficiency": ratio(t, 2 * t11),
        "references": "with the lever" if own and lever is not BASELINE else "plain 1x1, 1x2",
    }
    if own and lever is not BASELINE:
        out["over_baseline_1x1"] = ratio(t11, medians.get("1x1", nan))
        out["over_baseline_1x2"] = ratio(t12, medians.get("1x2", nan))
    return out


def run_throughput(
    setup: Setup, levers: list[Lever], repeats: int, references: bool = True
) -> dict[str, Any]:
    """Every lever alone on 2x1 (and the references), `repeats` interleaved rounds."""
    variants: dict[str, Callable[[int], dict[str, Any]]] = {}
    for lever in (BASELINE, *levers):
        with_refs = references and (lever is BASELINE or lever.alone_too)
        for layout in ("2x1", "1x1", "1x2") if with_refs else ("2x1",):
            variants[variant_name(layout, lever)] = functools.partial(
                measure, setup, layout, lever, SHUFFLE_SEED
            )
    runs = interleave(variants, repeats)
    medians = {k: median([r["examples_per_second"] for r in v]) for k, v in runs.items()}
    return {
        "runs": runs,
        "median_examples_per_second": medians,
        "baseline": figures(medians, BASELINE),
        "levers": {lever.name: {"what": lever.what, **figures(medians, lever)} for lever in levers},
    }


def accuracy_table(runs: Mapping[str, list[dict[str, Any]]], tolerance: float) -> dict[str, Any]:
    """Per variant: test accuracy per seed, mean, min, max; per lever its difference of means
    from the plain job and whether it keeps accuracy (no lower than the plain mean - tolerance)."""
    base = statistics.fmean(r["test_accuracy"] for r in runs["baseline"])
    table: dict[str, Any] = {}
    for name, rows in runs.items():
        acc = [r["test_accuracy"] for r in rows]
        mean = statistics.fmean(acc)
        row: dict[str, Any] = {
            "test_accuracy": acc,
            "seeds": [r["seed"] for r in rows],
            "mean": round(mean, 4),
            "min": min(acc),
            "max": max(acc),
        }
        if name != "baseline":
            row["difference_of_means"] = round(mean - base, 4)
            row["keeps_accuracy"] = mean >= base - tolerance
        table[name] = row
    return table


def run_accuracy(setup: Setup, levers: list[Lever], seeds: int, tolerance: float) -> dict[str, Any]:
    """The plain 2x1 job and each accuracy lever, one seed per round (the same seeds for all)."""
    chosen = [lever for lever in levers if lever.accuracy]

    def one(lever: Lever) -> Callable[[int], dict[str, Any]]:
        return lambda r: measure(setup, "2x1", lever, SHUFFLE_SEED + r, r)

    runs = interleave({lever.name: one(lever) for lever in (BASELINE, *chosen)}, seeds)
    return {
        "runs": runs,
        "accuracy": accuracy_table(runs, tolerance),
        "levers": {lever.name: lever.what for lever in chosen},
    }


def run_profile(setup: Setup, lever: Lever) -> dict[str, Any]:
    """One 2x1 run with `lever` under bench.rank_profile and HOROVOD_TIMELINE, analysed."""
    from bench.step_profile import analyse

    prefix = setup.work / f"profile-{lever.name}"
    timeline, threads_dir = prefix.with_name(prefix.name + "-timeline.json"), prefix / "threads"
    fields = {"batch_size_per_worker": BATCH_SIZE, **model_fields(setup.model), **lever.fields}
    args = trainer_args(setup.data, prefix / "run", 2, setup.epochs, 1, **fields)
    env = {**lever_env(lever, 2), "HOROVOD_TIMELINE": str(timeline)}
    job, summary = run_trainer(
        2, [str(threads_dir), "--", *args], env, 1 if lever.pin else 0, module="bench.rank_profile"
    )
    return {
        "lever": lever.name,
        "examples_per_second": job_throughput(summary),
        "profile": analyse(timeline, threads_dir),
    }


def pick_levers(names: str) -> list[Lever]:
    """The levers named in the comma-separated `names` ("all" for every one)."""
    known = {lever.name: lever for lever in LEVERS}
    wanted = list(known) if names == "all" else [n for n in names.split(",") if n]
    unknown = sorted(set(wanted) - set(known))
    if unknown:
        raise ValueError(f"unknown levers {unknown}; known: {', '.join(known)}")
    return [known[n] for n in wanted]


def settings(a: Any, levers: list[Lever], mode: str) -> dict[str, Any]:
    """What a result was measured with."""
    return {
        "mode": mode,
        "model": a.model or default_model(),
        "layout": "2x1 (2 ranks x 1 thread); references 1x1, 1x2",
        "batch_size_per_worker": BATCH_SIZE,
        "train_samples": a.train_samples,
        "epochs": a.epochs,
        "repeats": a.repeats,
        "levers": {lever.name: lever.what for lever in levers},
        "horovod_environment": {k: v for k, v in os.environ.items() if k.startswith("HOROVOD_")},
        "throughput": "examples/s of the whole job, median epoch after the first",
    }


def parser() -> Any:
    """The CLI's options."""
    p = base_parser(__doc__ or NAME)
    p.add_argument(
        "--levers", default="all", help=f"comma-separated, or all; quick: {QUICK_LEVERS}"
    )
    p.add_argument("--train-samples", type=int, default=None, help="6,000 (accuracy: 8,000)")
    p.add_argument("--epochs", type=int, default=None, help=f"3 (accuracy: {EPOCHS})")
    p.add_argument("--no-references", action="store_true", help="2x1 only: no 1x1, 1x2 runs")
    p.add_argument("--accuracy", action="store_true", help="the accuracy mode (seeds = repeats)")
    p.add_argument("--tolerance", type=float, default=0.002, help="accuracy a lever may lose")
    p.add_argument("--profile", action="store_true", help="the profile mode: one 2x1 run")
    p.add_argument("--profile-lever", default="baseline", help="the lever to profile with")
    add_model_option(p)
    return p


def main(argv: list[str] | None = None) -> int:
    """CLI: ``python -m bench.levers [--levers a,b] [--accuracy | --profile]``."""
    p = parser()
    a = p.parse_args(argv)
    mode = "accuracy" if a.accuracy else "profile" if a.profile else "throughput"
    samples, epochs = (8000, EPOCHS) if mode == "accuracy" else (6000, 3)
    if a.quick:
        samples, epochs, a.repeats = 600, 1, 1
        a.levers = QUICK_LEVERS if a.levers == "all" else a.levers
    a.train_samples, a.epochs = a.train_samples or samples, a.epochs or epochs
    try:
        levers = pick_levers(a.levers)
        profiled = BASELINE if a.profile_lever == "baseline" else pick_levers(a.profile_lever)[0]
        model_fields(a.model)
    except ValueError as exc:
        p.error(str(exc))
    work = scratch(a.work, NAME)
    setup = Setup(bench_dataset(work, a.train_samples), work, a.epochs, a.model)
    result: dict[str, Any] = {
        "settings": settings(a, levers, mode),
        "machine_before": machine_state(),
    }
    if mode == "accuracy":
        result.update(run_accuracy(setup, levers, a.repeats, a.tolerance))
        result["settings"]["tolerance"] = a.tolerance
    elif mode == "profile":
        result.update(run_profile(setup, profiled))
    else:
        result.update(run_throughput(setup, levers, a.repeats, not a.no_references))
    name = NAME if mode == "throughput" else f"{NAME}_{mode}"
    write_result(name, result, a.out)
    print(summary_line(result))
    return 0


def summary_line(result: dict[str, Any]) -> str:
    """The headline of a result, for the terminal."""
    if "accuracy" in result:
        return str({k: (v["mean"], v.get("keeps_accuracy")) for k, v in result["accuracy"].items()})
    if "profile" in result:
        return str(result["profile"]["breakdown"])
    keys = ("over_baseline_2x1", "ceiling_ratio", "efficiency")
    rows = {"baseline": result["baseline"], **result["levers"]}
    return str({name: [row[k] for k in keys] for name, row in rows.items()})


if __name__ == "__main__":
    sys.exit(main())
