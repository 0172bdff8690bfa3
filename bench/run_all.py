"""``make bench``: every benchmark, then ``summary.md`` and ``scaling.png`` in bench/results.

Every benchmark trains the trainer's default model at the project's defaults: local jobs on
Open MPI with yielding waits, batch 64 per worker. ``--quick`` runs tiny sizes (minutes) to
check that everything works; ``--only`` runs a subset. See bench/README.md for how long the
full run takes.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

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
from bench.common import RESULTS_DIR, write_result
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


def main(argv: list[str] | None = None) -> int:
    """Run the selected benchmarks, then write the report."""
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--out", type=Path, default=RESULTS_DIR)
    p.add_argument("--work", type=Path, default=None, help="scratch directory (default: temp)")
    p.add_argument("--quick", action="store_true", help="tiny sizes, one repeat")
    p.add_argument("--only", default=",".join(BENCHMARKS), help="comma-separated names")
    p.add_argument("--repeats", type=int, default=3)
    a = p.parse_args(argv)
    names = [n for n in a.only.split(",") if n]
    unknown = sorted(set(names) - set(BENCHMARKS))
    if unknown:
        p.error(f"unknown benchmarks {unknown}; known: {', '.join(BENCHMARKS)}")
    common = ["--out", str(a.out), "--repeats", str(a.repeats)]
    if a.work:
        common += ["--work", str(a.work)]
    full = {**FULL_FLAGS, "scaling": ["--repeats", str(max(SCALING_ROUNDS, a.repeats))]}
    timings, started = {}, time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    for name in names:
        flags = common + (["--quick"] if a.quick else full.get(name, []))
        print(f"== {name} {' '.join(flags)}", flush=True)
        t0 = time.monotonic()
        BENCHMARKS[name](flags)
        timings[name] = time.monotonic() - t0
        print(f"== {name} took {timings[name]:.0f} s", flush=True)
    seconds = {k: round(v) for k, v in timings.items()}
    if not a.quick and names == list(BENCHMARKS):  # the page names the full run it came from
        record = {"started": started, "seconds": seconds}
        write_result(RUN_RECORD, {**record, "total_seconds": round(sum(timings.values()))}, a.out)
    for path in write_report(a.out, DOC if a.out == RESULTS_DIR else None):
        print(f"wrote {path}")
    print("time per benchmark (s):", seconds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
