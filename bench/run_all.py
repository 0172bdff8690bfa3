"""``make bench``: every benchmark, then ``summary.md`` and ``scaling.png`` in bench/results.

Every benchmark trains the trainer's default model at the project's defaults: local jobs on
Open MPI with yielding waits, batch 64 per worker. ``--quick`` runs tiny sizes (minutes) to
check that everything works; ``--only`` runs a subset. See bench/README.md for how long the
full run takes.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path

import click

from bench import (
    data_prep,
    faults,
    input_pipeline,
    levers,
    mwms,
    pipeline_overhead,
    scaling,
    time_to_accuracy,
)
from bench.common import RESULTS_DIR, bench_main, comma_names, write_result
from bench.report import DOC, write_report

BENCHMARKS: dict[str, Callable[[list[str]], int]] = {
    "data_prep": data_prep.main,
    "scaling": scaling.main,
    "levers": levers.main,
    "mwms": mwms.main,
    "time_to_accuracy": time_to_accuracy.main,
    "pipeline_overhead": pipeline_overhead.main,
    "input_pipeline": input_pipeline.main,
    "faults": faults.main,
}
# Extra flags of the full run (kept here so the budget is visible in one place).
FULL_FLAGS: dict[str, list[str]] = {
    "pipeline_overhead": ["--also-epochs", "24"],
    "faults": ["--readme", str(Path(__file__).resolve().parents[1] / "docs" / "reliability.md")],
}


SCALING_ROUNDS = 5  # the headline efficiency comes from at least 5 interleaved rounds
RUN_RECORD = "make_bench"  # bench/results/make_bench.json: when the full run started, its length


@click.command(help=__doc__)
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    default=RESULTS_DIR,
    show_default="bench/results",
)
@click.option(
    "--work",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="scratch directory (default: temp)",
)
@click.option("--quick", is_flag=True, help="tiny sizes, one repeat")
@click.option(
    "--only",
    "names",
    default=",".join(BENCHMARKS),
    show_default=True,
    callback=comma_names("benchmarks", list(BENCHMARKS)),
    help="comma-separated names",
)
@click.option("--repeats", type=int, default=3, show_default=True)
def command(out: Path, work: Path | None, quick: bool, names: list[str], repeats: int) -> int:
    """Run the selected benchmarks, then write the report."""
    common = ["--out", str(out), "--repeats", str(repeats)]
    if work:
        common += ["--work", str(work)]
    full = {**FULL_FLAGS, "scaling": ["--repeats", str(max(SCALING_ROUNDS, repeats))]}
    timings, started = {}, time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    for name in names:
        flags = common + (["--quick"] if quick else full.get(name, []))
        print(f"== {name} {' '.join(flags)}", flush=True)
        t0 = time.monotonic()
        BENCHMARKS[name](flags)
        timings[name] = time.monotonic() - t0
        print(f"== {name} took {timings[name]:.0f} s", flush=True)
    seconds = {k: round(v) for k, v in timings.items()}
    if not quick and names == list(BENCHMARKS):  # the page names the full run it came from
        record = {"started": started, "seconds": seconds}
        write_result(RUN_RECORD, {**record, "total_seconds": round(sum(timings.values()))}, out)
    for path in write_report(out, DOC if out == RESULTS_DIR else None):
        print(f"wrote {path}")
    print("time per benchmark (s):", seconds)
    return 0


def main(argv: list[str] | None = None) -> int:
    return bench_main(command, argv, "bench.run_all")


if __name__ == "__main__":
    sys.exit(main())
