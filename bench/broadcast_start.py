"""How long a large model's start takes on 2 ranks: the broadcast of the model's and the
optimizer's variables that Horovod's ``BroadcastGlobalVariablesCallback`` (and an elastic
reset) runs before the first step, for ``keras.applications.ResNet50(weights=None)`` with Adam
(750 variables). Two ways, interleaved round by round in one 2-rank ``mpirun`` job:
``in_place``, the project's build (make/horovod/patches/0003: one in-place Horovod operation per
dtype, enqueuing all its variables at once), and ``per_variable``, patch 0002's (one
``hvd.broadcast`` per variable, written here as it was).

    python -m bench.broadcast_start [--repeats N] [--out DIR] [--quick]

Writes ``broadcast_start.json``: each way's seconds per round (rank 0's, the ranks aligned by an
allreduce before each), their medians and ``per_variable_over_in_place``. ``--quick``: a small
model instead of ResNet50.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import click

from bench.common import (
    bench_main,
    bench_options,
    horovod_command,
    local_job_env,
    machine_state,
    median,
    ratio,
    write_result,
)

NAME = "broadcast_start"
RESULT_PREFIX = "broadcast_start: "


def per_variable(hvd: Any, tf: Any, variables: list[Any], name: str) -> None:
    """Patch 0002's broadcast: each variable's value, one collective per variable, in order."""
    for i, var in enumerate(variables):
        var.assign(hvd.broadcast(tf.convert_to_tensor(var), 0, name=f"{name}.{i}"))


def worker(repeats: int, quick: bool) -> None:
    """Every rank: build the model and Adam, then time both broadcasts of all their variables,
    `repeats` rounds, alternating which goes first; rank 0 prints the seconds as JSON."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import horovod.tensorflow.keras as hvd
    import keras
    import tensorflow as tf
    from horovod._keras import keras3

    hvd.init()
    if quick:
        layers = [keras.layers.Dense(64) for _ in range(20)]
        model = keras.Sequential([keras.Input(shape=(64,)), *layers])
    else:
        model = keras.applications.ResNet50(weights=None)
    optimizer = keras.optimizers.Adam()
    optimizer.build(model.trainable_variables)
    variables = [*model.variables, *optimizer.variables]
    ways = {
        "in_place": lambda: keras3.broadcast_variables(variables, 0, "bench.in_place"),
        "per_variable": lambda: per_variable(hvd, tf, variables, "bench.per_variable"),
    }
    seconds: dict[str, list[float]] = {way: [] for way in ways}
    for round_no in range(repeats):
        order = list(ways) if round_no % 2 == 0 else list(reversed(ways))
        for way in order:
            hvd.allreduce(tf.constant(0.0), name="bench.align")  # both ranks start together
            start = time.perf_counter()
            ways[way]()
            seconds[way].append(time.perf_counter() - start)
    if hvd.rank() == 0:
        record = {"variables": len(variables), "seconds": seconds}
        print(RESULT_PREFIX + json.dumps(record), flush=True)


@click.command(help=__doc__.splitlines()[0])
@bench_options
@click.option("--worker", "rank", is_flag=True, hidden=True)  # a rank of the job it starts
def command(out: Path, work: Path | None, repeats: int, quick: bool, rank: bool) -> int:
    if rank:
        worker(repeats, quick)
        return 0
    before = machine_state()
    flags = ["--worker", "--repeats", str(repeats), *(["--quick"] if quick else [])]
    job = horovod_command(2, "bench.broadcast_start", flags)
    proc = subprocess.run(job, capture_output=True, text=True, env=local_job_env(2))
    found = [line for line in proc.stdout.splitlines() if RESULT_PREFIX in line]
    if proc.returncode != 0 or not found:
        sys.stderr.write(f"broadcast_start: the job failed ({proc.returncode}):\n{proc.stderr}\n")
        return 1
    record = json.loads(found[-1].split(RESULT_PREFIX, 1)[1])
    medians = {way: median(s) for way, s in record["seconds"].items()}
    write_result(
        NAME,
        {
            "model": "small" if quick else "ResNet50(weights=None) + Adam",
            "variables": record["variables"],
            "seconds": record["seconds"],
            "median_seconds": medians,
            "per_variable_over_in_place": ratio(medians["per_variable"], medians["in_place"]),
            "machine_before": before,
        },
        out,
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    return bench_main(command, argv, "bench.broadcast_start")


if __name__ == "__main__":
    sys.exit(main())
