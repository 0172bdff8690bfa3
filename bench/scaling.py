"""Horovod scaling on one machine: training throughput of the project's trainer per layout.

A layout is ``NxT``: N Horovod processes with T CPU threads each, started as the launcher
starts a local job (Open MPI, waiting ranks yielding). The default compares 1x1, 2x1 and 1x2
(same cores as 2x1, one process). Two figures:

- ``efficiency`` = T(2x1) / (2 T(1x1)): what a second rank buys;
- ``ceiling_ratio`` = T(2x1) / T(1x2): Horovod's ranks against one process on the same cores;
- ``efficiency_vs_machine`` = T(2x1) / T(two 1x1 at once): against the machine's own ceiling,
  two independent 1x1 jobs started at the same moment (``two_1x1_at_once``), which share
  nothing but the machine's cores, memory bandwidth and caches.

Throughput is the trainer's own figure (``run_summary.json``: examples/s from the median
epoch time, first epoch excluded), for the whole job. Beside the measured efficiency stands the
job's own estimate, from its run summary (``resource_use.estimated_efficiency``: compute's
share of a step, each rank's own clock). The trainer's default model is measured (``--model``
for another, e.g. ``small``). On a bigger machine or a GPU node::

    python -m bench.scaling --layouts 1x1,2x1,4x1 --out bench/results
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import click

from bench.common import (
    bench_dataset,
    bench_main,
    bench_options,
    horovod_command,
    interleave,
    job_throughput,
    local_job_env,
    machine_state,
    median,
    model_fields,
    model_option,
    ratio,
    run_trainer,
    scratch,
    trainer_args,
    write_result,
)
from components.common.defaults import MODEL
from components.train import summary as run_summary
from standins.commands import collect, start_command

NAME = "scaling"
DEFAULT_LAYOUTS = "1x1,2x1,1x2"
# The machine's own ceiling for two ranks: two independent 1x1 jobs at once (not a layout).
COPIES = "two_1x1_at_once"


Layout = tuple[int, int]


def two_copies(
    data: str,
    work: Path,
    epochs: int,
    batch_size: int,
    name: str,
    python: str | None = None,
    model: str | None = None,
) -> dict[str, Any]:
    """Two independent 1-rank jobs started at the same moment, 1 thread each, no allreduce
    between them: the sum of their throughputs is what two processes get from this machine's
    cores at all, the ceiling of any 2-rank job's throughput here."""
    jobs = []
    for copy in (0, 1):
        output = work / f"{name}-copy{copy}"
        fields = {"batch_size_per_worker": batch_size, **model_fields(model)}
        args = trainer_args(data, output, 1, epochs, 1, **fields)
        command = horovod_command(1, "components.train.rank", args, python=python)
        jobs.append((start_command(command, local_job_env(1)), output))
    rates = []
    for job, output in jobs:
        collect(job)
        rates.append(job_throughput(asdict(run_summary.read(str(output / "run_summary.json")))))
    return {"examples_per_second": sum(rates), "per_copy": rates}


def parse_layout(text: str) -> Layout:
    """``"2x1"`` -> ``(2, 1)``."""
    workers, _, threads = text.lower().strip().partition("x")
    layout = int(workers), int(threads or 1)
    if min(layout) < 1:
        raise ValueError(f"bad layout {text!r}: expected NxT with N, T >= 1")
    return layout


def layout_name(workers: int, threads: int) -> str:
    """``(2, 1)`` -> ``"2x1"``."""
    return f"{workers}x{threads}"


def measure_layout(
    data: str,
    work: Path,
    layout: Layout,
    epochs: int,
    batch_size: int,
    model: str | None,
    round_no: int,
) -> dict[str, Any]:
    """One training run of the layout; its job throughput and per-rank figures."""
    workers, threads = layout
    output = work / f"{model or 'default'}-{layout_name(*layout)}-b{batch_size}-r{round_no}"
    fields = {"batch_size_per_worker": batch_size, **model_fields(model)}
    args = trainer_args(data, output, workers, epochs, threads, **fields)
    job, summary = run_trainer(workers, args)
    return {
        "examples_per_second": job_throughput(summary),
        "estimated_efficiency": (summary.get("resource_use") or {}).get("estimated_efficiency"),
        "per_rank_examples_per_second": [r["examples_per_second"] for r in summary["per_rank"]],
        "steps_per_epoch": summary["per_rank"][0]["steps_per_epoch"],
        "wall_seconds": round(job.wall_seconds, 2),
        "final_accuracy": summary["final_metrics"].get("accuracy"),
    }


def run(
    layouts: list[Layout],
    train_samples: int,
    epochs: int,
    repeats: int,
    work: Path,
    batch_size: int = 64,
    model: str | None = None,
) -> dict[str, Any]:
    """Measure every layout `repeats` times, interleaved; medians and ratios."""
    data, machine_before = bench_dataset(work, train_samples), machine_state()
    variants: dict[str, Callable[[int], dict[str, Any]]] = {
        layout_name(*layout): functools.partial(
            measure_layout, data, work, layout, epochs, batch_size, model
        )
        for layout in layouts
    }
    if (2, 1) in layouts:
        variants[COPIES] = lambda r: two_copies(
            data, work, epochs, batch_size, f"{COPIES}-r{r}", model=model
        )
    runs = interleave(variants, repeats)
    medians = {name: median([r["examples_per_second"] for r in rs]) for name, rs in runs.items()}
    main = {k: v for k, v in medians.items() if k != COPIES}
    result: dict[str, Any] = {
        "settings": {
            "model": model or MODEL,
            "layouts": [k for k in variants if k != COPIES],
            "train_samples": train_samples,
            "epochs": epochs,
            "repeats": repeats,
            "batch_size_per_worker": batch_size,
            "throughput": "examples/s of the whole job, median epoch after the first",
        },
        "machine_before": machine_before,
        "runs": runs,
        "median_examples_per_second": main,
        "ratios": derived_ratios(main),
    }
    if COPIES in medians:
        result["machine_ceiling"] = machine_ceiling(main, medians[COPIES])
        result["machine_ceiling"]["efficiency_vs_machine_by_round"] = [
            ratio(job["examples_per_second"], copies["examples_per_second"])
            for job, copies in zip(runs["2x1"], runs[COPIES], strict=True)
        ]
    estimate = estimate_beside_measured(runs, result["ratios"])
    if estimate:
        result["estimate"] = estimate
    return result


def estimate_beside_measured(
    runs: dict[str, list[dict[str, Any]]], ratios: dict[str, float]
) -> dict[str, float] | None:
    """The 2x1 runs' own estimate of their efficiency (median) beside the measured one."""
    estimates = [
        r["estimated_efficiency"] for r in runs.get("2x1", []) if r["estimated_efficiency"]
    ]
    if not estimates or "efficiency" not in ratios:
        return None
    estimate = median(estimates)
    return {
        "estimated_efficiency_2x1": round(estimate, 3),
        "measured_efficiency_2x1": ratios["efficiency"],
        "estimate_over_measured": ratio(estimate, ratios["efficiency"]),
    }


def machine_ceiling(main: dict[str, float], copies: float) -> dict[str, Any]:
    """The 2x1 job against two 1x1 jobs at once, and those against twice one 1x1 alone."""
    return {
        "two_1x1_at_once": copies,
        "over_two_1x1": ratio(copies, 2 * main["1x1"]) if "1x1" in main else None,
        "efficiency_vs_machine": ratio(main["2x1"], copies),
    }


def derived_ratios(medians: dict[str, float]) -> dict[str, float]:
    """The two figures, ``efficiency`` = T(2x1) / (2 T(1x1)) and ``ceiling_ratio`` =
    T(2x1) / T(1x2); ``efficiency_NxT`` for other N, and ``1x2_over_1x1``."""
    out: dict[str, float] = {}
    for name, value in medians.items():
        workers, threads = parse_layout(name)
        base = medians.get("1x1")
        if base and threads == 1 and workers > 1:
            key = "efficiency" if name == "2x1" else f"efficiency_{name}"
            out[key] = ratio(value, workers * base)
    if "2x1" in medians and "1x2" in medians:
        out["ceiling_ratio"] = ratio(medians["2x1"], medians["1x2"])
    if "1x2" in medians and "1x1" in medians:
        out["1x2_over_1x1"] = ratio(medians["1x2"], medians["1x1"])
    return out


def _layouts(ctx: click.Context, param: click.Parameter, text: str) -> list[Layout]:
    try:
        return list(dict.fromkeys(parse_layout(x) for x in text.split(",")))
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


@click.command(help=__doc__)
@bench_options
@click.option(
    "--layouts",
    default=DEFAULT_LAYOUTS,
    show_default=True,
    callback=_layouts,
    help="NxT list, e.g. 1x1,2x1,4x1",
)
@click.option("--train-samples", type=int, default=20000, show_default=True)
@click.option("--epochs", type=int, default=4, show_default=True, help="the first one is not timed")
@click.option("--batch-size", type=int, default=64, show_default=True, help="per worker")
@click.option(
    "--name", default=NAME, show_default=True, help="result file name (e.g. scaling_b256)"
)
@model_option
def command(
    out: Path,
    work: Path | None,
    repeats: int,
    quick: bool,
    layouts: list[Layout],
    train_samples: int,
    epochs: int,
    batch_size: int,
    name: str,
    model: str | None,
) -> int:
    if quick:
        train_samples, epochs, repeats = 600, 2, 1
    scratch_dir = scratch(work, NAME)
    result = run(layouts, train_samples, epochs, repeats, scratch_dir, batch_size, model)
    write_result(name, result, out)
    print(result["median_examples_per_second"], result["ratios"], result.get("machine_ceiling"))
    return 0


def main(argv: list[str] | None = None) -> int:
    """CLI: ``python -m bench.scaling [--layouts 1x1,2x1,1x2]``."""
    return bench_main(command, argv, "bench.scaling")


if __name__ == "__main__":
    sys.exit(main())
