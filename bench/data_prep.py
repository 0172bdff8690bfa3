"""Data prep cost and how it grows: ``prepare()`` on MNIST-format files of 5k, 60k, 600k samples.

Each input is an ``mnist.npz`` (``x_train``/``y_train`` plus a test split of a sixth of that,
as MNIST's 60k/10k) made of shifted copies of the real bundled digits, fed through the
project's ``prepare(..., data_sha256="none")`` (the CLI's ``--data-sha256 none``): read, validate,
shard, hash every shard, publish. Side by side, in the same rounds, a raw copy of the same
file (``shutil.copyfile``) gives the floor. Throughput is input MB / second. Linearity: a
least-squares line ``t = a + b n`` through the medians, and the per-sample time at each size.
"""

from __future__ import annotations

import functools
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import click
from scipy.stats import linregress

from bench.common import (
    bench_main,
    bench_options,
    comma_ints,
    interleave,
    machine_state,
    median,
    ratio,
    scratch,
    write_mnist_npz,
    write_result,
)
from components.data_prep.prep import prepare

NAME = "data_prep"
SIZES = [5_000, 60_000, 600_000]
QUICK_SIZES = [500, 2_000]


def timed(make: Any, target: Path) -> float:
    """Seconds for ``make(target)`` (``prepare()`` into a directory, or a raw copy to a file);
    `target` removed before and after."""
    shutil.rmtree(target, ignore_errors=True)
    t0 = time.perf_counter()
    make(str(target))
    seconds = time.perf_counter() - t0
    if target.is_dir():
        shutil.rmtree(target)
    else:
        target.unlink()
    return seconds


def linear_fit(sizes: list[float], seconds: list[float]) -> dict[str, float]:
    """Least squares ``t = a + b n``: intercept, slope per sample and R^2."""
    fit = linregress(sizes, seconds)
    return {
        "intercept_seconds": round(float(fit.intercept), 4),
        "microseconds_per_sample": round(float(fit.slope) * 1e6, 4),
        "r_squared": round(float(fit.rvalue) ** 2, 5),
    }


def run(sizes: list[int], repeats: int, work: Path) -> dict[str, Any]:
    """Every size: prepare and raw copy, interleaved, `repeats` rounds."""
    machine_before = machine_state()
    inputs = {n: work / f"mnist-{n}.npz" for n in sizes}
    nbytes = {n: write_mnist_npz(path, n, test=max(1, n // 6)) for n, path in inputs.items()}
    variants = {}
    for n, path in inputs.items():
        prep = functools.partial(prepare, str(path), data_sha256="none")
        copy = functools.partial(shutil.copyfile, path)
        variants[f"prepare_{n}"] = lambda r, f=prep, n=n: {"seconds": timed(f, work / f"out-{n}")}
        variants[f"copy_{n}"] = lambda r, f=copy, n=n: {"seconds": timed(f, work / f"{n}.copy")}
    runs = interleave(variants, repeats)
    rows = []
    for n in sizes:
        prep_s = median([r["seconds"] for r in runs[f"prepare_{n}"]])
        copy_s = median([r["seconds"] for r in runs[f"copy_{n}"]])
        mb = nbytes[n] / 1e6
        rows.append(
            {
                "train_samples": n,
                "total_samples": n + max(1, n // 6),
                "input_mb": round(mb, 2),
                "prepare_seconds": round(prep_s, 4),
                "copy_seconds": round(copy_s, 4),
                "prepare_mb_s": round(mb / prep_s, 1),
                "copy_mb_s": round(mb / copy_s, 1),
                "prepare_over_copy_time": ratio(prep_s, copy_s),
                "microseconds_per_sample": round(prep_s / (n + max(1, n // 6)) * 1e6, 3),
            }
        )
    growth = {
        f"time_{b['train_samples']}_over_{a['train_samples']}": ratio(
            b["prepare_seconds"], a["prepare_seconds"]
        )
        for a, b in zip(rows, rows[1:], strict=False)
    }
    return {
        "settings": {"sizes": sizes, "repeats": repeats, "sha256_check": "none (synthetic)"},
        "machine_before": machine_before,
        "runs": runs,
        "rows": rows,
        "growth": growth,
        "linear_fit": linear_fit(
            [float(r["total_samples"]) for r in rows], [r["prepare_seconds"] for r in rows]
        ),
    }


@click.command(help=__doc__)
@bench_options
@click.option(
    "--sizes",
    default=",".join(map(str, SIZES)),
    show_default=True,
    callback=lambda ctx, param, text: comma_ints(text),
    help="training samples, comma-separated",
)
def command(out: Path, work: Path | None, repeats: int, quick: bool, sizes: list[int]) -> int:
    if quick:
        sizes, repeats = QUICK_SIZES, 1
    scratch_dir = scratch(work, NAME)
    try:
        result = run(sizes, repeats, scratch_dir)
    finally:
        for npz in scratch_dir.glob("mnist-*.npz"):
            npz.unlink()
    write_result(NAME, result, out)
    print(result["rows"], result["linear_fit"])
    return 0


def main(argv: list[str] | None = None) -> int:
    """CLI: ``python -m bench.data_prep [--sizes 5000,60000,600000]``."""
    return bench_main(command, argv, "bench.data_prep")


if __name__ == "__main__":
    sys.exit(main())
