"""Two stacks side by side: this environment's TensorFlow and Horovod against another's.

The same trainer code (this checkout) runs under two Python environments: this one and
``--other-python`` (for example a venv of an older lock, TF 2.18's, with Horovod built for its
TF). Per stack, interleaved round by round: 1x1, 2x1 and two 1x1 jobs at once
(the machine's own ceiling, as in ``bench.scaling``). Figures:

- ``this_over_other``: this stack's throughput over the other's, per layout (below 1: this
  stack is slower on this model);
- per stack, ``efficiency`` T(2x1) / (2 T(1x1)) and ``efficiency_vs_machine``
  T(2x1) / T(two 1x1 at once).

    python -m bench.stack --other-python /path/to/venv-tf218/bin/python --other-name tf-2.18

The other environment needs the lock's runtime packages and a Horovod built for its TF, but
not this project installed: its ranks run ``python -m components.train.rank`` from this checkout, or
from ``--other-checkout`` (another checkout's trainer: a commit whose trainer runs tf-keras, say,
with a venv of its lock):

    python -m bench.stack --other-python /path/to/old/.venv/bin/python \
        --other-checkout /path/to/old-checkout --other-name tf-keras --name keras-3
"""

from __future__ import annotations

import functools
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from bench.common import (
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
from bench.scaling import COPIES, two_copies

NAME = "stack"
LAYOUTS = ("1x1", "2x1", COPIES)


def versions(python: str) -> dict[str, str]:
    """The TensorFlow, Keras, tf-keras, Horovod and Python versions of `python`'s environment
    (None for a distribution it does not have)."""
    code = (
        "import importlib.metadata as m, json, platform\n"
        "def v(n):\n    try: return m.version(n)\n    except m.PackageNotFoundError: return None\n"
        "print(json.dumps({'python': platform.python_version(), **{n: v(n) for n in "
        "('tensorflow', 'keras', 'tf-keras', 'horovod')}}))"
    )
    out = subprocess.run([python, "-c", code], capture_output=True, text=True, check=True)
    return dict(json.loads(out.stdout))


def measure(
    data: str, work: Path, epochs: int, batch: int, stack: str, python: str, layout: str, r: int
) -> dict[str, Any]:
    """One run of `layout` under `stack`'s `python`, seeded by its round `r` (both stacks alike):
    the job's throughput, and its last epoch's (averaged) training accuracy."""
    name = f"{stack}-{layout}-r{r}"
    if layout == COPIES:
        return two_copies(data, work, epochs, batch, name, python=python)
    workers = int(layout[0])
    args = trainer_args(data, work / name, workers, epochs, 1, batch_size_per_worker=batch, seed=r)
    _, summary = run_trainer(workers, args, python=python)
    accuracy = summary["final_metrics"].get("accuracy")
    return {"examples_per_second": job_throughput(summary), "accuracy": accuracy}


def in_checkout(python: str, checkout: Path, work: Path) -> str:
    """A launcher for `python` that runs it in `checkout`, so that ``python -m
    components.train.rank``
    is that checkout's trainer (``-m`` looks in the working directory first)."""
    wrapper = work / "other-python"
    wrapper.write_text(f'#!/bin/sh\ncd "{checkout.resolve()}" && exec "{python}" "$@"\n')
    wrapper.chmod(0o755)
    return str(wrapper)


def figures(medians: dict[str, float]) -> dict[str, float]:
    """One stack's efficiency and efficiency against the machine's ceiling."""
    return {
        "efficiency": ratio(medians["2x1"], 2 * medians["1x1"]),
        "efficiency_vs_machine": ratio(medians["2x1"], medians[COPIES]),
        "two_1x1_at_once_over_two_1x1": ratio(medians[COPIES], 2 * medians["1x1"]),
    }


def run(
    stacks: dict[str, str], train_samples: int, epochs: int, repeats: int, work: Path, batch: int
) -> dict[str, Any]:
    """Every layout of every stack, `repeats` interleaved rounds; medians and ratios."""
    data = bench_dataset(work, train_samples)
    one = functools.partial(measure, data, work, epochs, batch)
    variants: dict[str, Callable[[int], dict[str, Any]]] = {
        f"{stack}/{layout}": functools.partial(one, stack, py, layout)
        for stack, py in stacks.items()
        for layout in LAYOUTS
    }
    machine_before = machine_state()
    runs = interleave(variants, repeats)
    medians = {k: median([r["examples_per_second"] for r in v]) for k, v in runs.items()}
    this, other = list(stacks)
    by = {s: {lay: medians[f"{s}/{lay}"] for lay in LAYOUTS} for s in stacks}
    return {
        "settings": {
            "train_samples": train_samples,
            "epochs": epochs,
            "repeats": repeats,
            "batch_size_per_worker": batch,
            "threads_per_worker": 1,
        },  # fmt: skip
        "stacks": {s: versions(py) for s, py in stacks.items()},
        "this_and_other": [this, other],
        "machine_before": machine_before,
        "runs": runs,
        "median_examples_per_second": by,
        "this_over_other": {lay: ratio(by[this][lay], by[other][lay]) for lay in LAYOUTS},
        "accuracy_by_round": {
            k: [r.get("accuracy") for r in v] for k, v in runs.items() if COPIES not in k
        },
        "figures": {s: figures(by[s]) for s in stacks},
    }


@click.command(help=__doc__)
@bench_options
@click.option("--other-python", required=True, help="the other environment's python")
@click.option("--other-name", default="other", show_default=True, help="its name in the results")
@click.option(
    "--other-checkout",
    type=click.Path(file_okay=False, path_type=Path),
    help="run the other stack's trainer from here",
)
@click.option(
    "--result",
    default=NAME,
    show_default=True,
    help="the result's name: bench/results/RESULT.json",
)
@click.option(
    "--name", default="this", show_default=True, help="this environment's name in the results"
)
@click.option("--train-samples", type=int, default=8000, show_default=True)
@click.option("--epochs", type=int, default=4, show_default=True, help="the first one is not timed")
@click.option("--batch-size", type=int, default=64, show_default=True, help="per worker")
def command(
    out: Path,
    work: Path | None,
    repeats: int,
    quick: bool,
    other_python: str,
    other_name: str,
    other_checkout: Path | None,
    result: str,
    name: str,
    train_samples: int,
    epochs: int,
    batch_size: int,
) -> int:
    if quick:
        train_samples, epochs, repeats = 600, 2, 1
    scratch_dir = scratch(work, NAME)
    other = other_python
    if other_checkout is not None:
        other = in_checkout(other, other_checkout, scratch_dir)
    stacks = {name: sys.executable, other_name: other}
    record = run(stacks, train_samples, epochs, repeats, scratch_dir, batch_size)
    record["other_trainer"] = "its own checkout's" if other_checkout else "this checkout's"
    write_result(result, record, out)
    print(record["this_over_other"], record["figures"])
    return 0


def main(argv: list[str] | None = None) -> int:
    """CLI: ``python -m bench.stack --other-python PY [--other-name NAME]``."""
    return bench_main(command, argv, "bench.stack")


if __name__ == "__main__":
    sys.exit(main())
