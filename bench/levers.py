"""Which launcher and Horovod settings make a local job scale? Each lever against the default.

The default (``baseline``): a static job on Open MPI with waiting ranks yielding their core
(``launch.local_command``). Every lever changes one thing of it; all variants run interleaved
round by round (``--repeats``), beside the 1x1 and 1x2 references:

- ``gloo``: Horovod's Gloo controller (``horovodrun --gloo``: TCP over loopback), the
  project's local default before this benchmark;
- ``mpi_busy_wait``: Open MPI without ``mpi_yield_when_idle`` (a waiting rank spins);
- ``bind_to_core``: Open MPI binding each rank to a core (``-bind-to core``, not ``none``);
- ``3x1`` and ``gloo_3x1``: 3 ranks on the same cores, each controller;
- ``grouped``: ``DistributedOptimizer(groups=1)``, one grouped allreduce per step
  (`bench.variants`); ``cycle_1ms``, ``cycle_20ms``: ``HOROVOD_CYCLE_TIME`` (default 5);
  ``autotune``: ``HOROVOD_AUTOTUNE=1`` (Horovod tunes fusion and cycle time as it runs).

A reference beside them, ``two_copies``: two independent 1-rank jobs at once, each 1 thread, no
allreduce between them: what two processes get from this machine's cores at all (the ceiling
of any 2-rank job's efficiency here).

Per lever: its throughput against the default at the same rank count (``over_baseline``),
``efficiency`` T(Nx1) / (N T(1x1)) and, for 2 ranks, ``ceiling_ratio`` T(2x1) / T(1x2). For
every 2-rank variant, the run summary's own estimate (``resource_use``: compute's share of a
step) is recorded beside the measured efficiency. None of these levers changes the arithmetic.

    python -m bench.levers [--levers gloo,grouped] [--repeats 3]
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click

from bench.common import (
    BUSY_WAIT,
    Edit,
    bench_dataset,
    bench_main,
    bench_options,
    interleave,
    job_throughput,
    machine_state,
    median,
    ratio,
    run_trainer,
    scratch,
    trainer_args,
    write_result,
)
from bench.scaling import two_copies
from components.common.defaults import MODEL

NAME = "levers"
BATCH_SIZE = 64  # per worker: the batch the gap was measured at


@dataclass(frozen=True)
class Lever:
    """One change to the default job: its ranks, controller, environment or trainer variant."""

    name: str
    what: str
    workers: int = 2
    controller: str = "mpi"
    edit: Edit | None = None  # a change to the launcher's mpirun command line
    env: Mapping[str, str] = field(default_factory=dict)
    variant: tuple[str, ...] = ()  # bench.variants flags


BASELINE = Lever("baseline", "Open MPI, waiting ranks yield (the default)")
BASELINE_3 = Lever("3x1", "3 ranks, Open MPI with yielding waits", workers=3)
LEVERS = (
    Lever("gloo", "Horovod's Gloo controller (horovodrun --gloo)", controller="gloo"),
    Lever("mpi_busy_wait", "Open MPI without mpi_yield_when_idle", edit=BUSY_WAIT),
    Lever(
        "bind_to_core",
        "Open MPI binding each rank to a core",
        edit=(("-bind-to", "none"), ("-bind-to", "core")),
    ),  # fmt: skip
    BASELINE_3,
    Lever("gloo_3x1", "3 ranks, Gloo", workers=3, controller="gloo"),
    Lever("grouped", "DistributedOptimizer(groups=1)", variant=("--groups", "1")),
    Lever("cycle_1ms", "HOROVOD_CYCLE_TIME=1 (ms; default 5)", env={"HOROVOD_CYCLE_TIME": "1"}),
    Lever("cycle_20ms", "HOROVOD_CYCLE_TIME=20", env={"HOROVOD_CYCLE_TIME": "20"}),
    Lever("autotune", "HOROVOD_AUTOTUNE=1", env={"HOROVOD_AUTOTUNE": "1"}),
)
REFERENCES = {"1x1": (1, 1), "1x2": (1, 2)}
QUICK_LEVERS = "gloo,grouped"


@dataclass(frozen=True)
class Setup:
    """What every job of one benchmark run shares."""

    data: str
    work: Path
    epochs: int


def measure(setup: Setup, name: str, workers: int, threads: int, lever: Lever, r: int) -> dict:
    """One job: its throughput, and (for several ranks) the summary's own split of a step."""
    output = setup.work / f"{name}-r{r}"
    args = trainer_args(
        setup.data, output, workers, setup.epochs, threads, batch_size_per_worker=BATCH_SIZE
    )
    if lever.variant:
        args = [*lever.variant, "--", *args]
    job, summary = run_trainer(
        workers, args, env=dict(lever.env), controller=lever.controller,
        edit=lever.edit, module="bench.variants" if lever.variant else None,
    )  # fmt: skip
    use = summary.get("resource_use") or {}
    return {
        "examples_per_second": job_throughput(summary),
        "controller": summary["controller"],
        "wall_seconds": round(job.wall_seconds, 2),
        "estimated_efficiency": use.get("estimated_efficiency"),
        "communication_share": use.get("communication_share"),
        "waiting_share": use.get("waiting_share"),
    }


def figures(medians: Mapping[str, float], lever: Lever, runs: Mapping[str, list]) -> dict:
    """A lever against the default of its rank count, its efficiency and ceiling ratio, and the
    run summary's estimate (median over rounds) beside the measured efficiency."""
    nan = float("nan")
    t = medians.get(lever.name, nan)
    baseline = BASELINE_3 if lever.workers == 3 else BASELINE
    estimates = [r["estimated_efficiency"] for r in runs.get(lever.name, [])]
    out = {
        "what": lever.what,
        "examples_per_second": t,
        "over_baseline": ratio(t, medians.get(baseline.name, nan)),
        "efficiency": ratio(t, lever.workers * medians.get("1x1", nan)),
        "estimated_efficiency": median([e for e in estimates if e is not None]),
    }
    if lever.workers == 2:
        out["ceiling_ratio"] = ratio(t, medians.get("1x2", nan))
    return out


def run(setup: Setup, levers: list[Lever], repeats: int) -> dict[str, Any]:
    """The default, every lever and the references, `repeats` interleaved rounds."""
    variants: dict[str, Callable[[int], dict[str, Any]]] = {}
    for name, (workers, threads) in REFERENCES.items():
        variants[name] = functools.partial(measure, setup, name, workers, threads, BASELINE)
    variants["two_copies"] = lambda r: two_copies(  # two independent 1-rank jobs at once
        setup.data, setup.work, setup.epochs, BATCH_SIZE, f"two_copies-r{r}"
    )
    chosen = {lever.name: lever for lever in (BASELINE, *levers)}
    for name, lever in chosen.items():
        variants[name] = functools.partial(measure, setup, name, lever.workers, 1, lever)
    runs = interleave(variants, repeats)
    medians = {k: median([r["examples_per_second"] for r in v]) for k, v in runs.items()}
    table = {name: figures(medians, lever, runs) for name, lever in chosen.items()}
    ceiling = ratio(medians["two_copies"], 2 * medians["1x1"])
    return {"runs": runs, "median_examples_per_second": medians, "levers": table,
            "two_copies_over_two_1x1": ceiling}  # fmt: skip


def pick_levers(names: str) -> list[Lever]:
    """The levers named in the comma-separated `names` ("all" for every one)."""
    known = {lever.name: lever for lever in LEVERS}
    wanted = list(known) if names == "all" else [n for n in names.split(",") if n]
    unknown = sorted(set(wanted) - set(known))
    if unknown:
        raise ValueError(f"unknown levers {unknown}; known: {', '.join(known)}")
    return [known[n] for n in wanted]


@click.command(help=__doc__)
@bench_options
@click.option(
    "--levers", default="all", show_default=True, help=f"comma-separated; quick: {QUICK_LEVERS}"
)
@click.option("--train-samples", type=int, default=6000, show_default=True)
@click.option("--epochs", type=int, default=4, show_default=True, help="the first one is not timed")
def command(
    out: Path,
    work: Path | None,
    repeats: int,
    quick: bool,
    levers: str,
    train_samples: int,
    epochs: int,
) -> int:
    if quick:
        train_samples, epochs, repeats = 600, 2, 1
        levers = QUICK_LEVERS if levers == "all" else levers
    try:
        chosen = pick_levers(levers)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="'--levers'") from None
    scratch_dir = scratch(work, NAME)
    setup = Setup(bench_dataset(scratch_dir, train_samples), scratch_dir, epochs)
    result: dict[str, Any] = {
        "settings": {
            "model": MODEL, "batch_size_per_worker": BATCH_SIZE, "threads_per_rank": 1,
            "train_samples": train_samples, "epochs": epochs, "repeats": repeats,
            "throughput": "examples/s of the whole job, median epoch after the first",
        },
        "machine_before": machine_state(),
        **run(setup, chosen, repeats),
    }  # fmt: skip
    write_result(NAME, result, out)
    keys = ("over_baseline", "efficiency", "estimated_efficiency")
    print({name: [row.get(k) for k in keys] for name, row in result["levers"].items()})
    return 0


def main(argv: list[str] | None = None) -> int:
    """CLI: ``python -m bench.levers [--levers a,b]``."""
    return bench_main(command, argv, "bench.levers")


if __name__ == "__main__":
    sys.exit(main())
