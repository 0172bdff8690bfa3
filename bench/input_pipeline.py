"""Profile: does the trainer's input pipeline (a Keras Sequence) cost throughput?

The trainer feeds Keras from a ``tf.keras.utils.Sequence`` (numpy indexing in Python, wrapped
by Keras in a generator dataset). The variant swaps only that for a ``tf.data`` pipeline over
the same disjoint shard (shuffled every epoch, same number of steps, prefetched), like the
MWMS benchmark uses; model, optimizer, Horovod and callbacks stay the project's. Both run at
1 x 1 and 2 x 1, each process pinned to its own core, interleaved::

    python -m bench.input_pipeline --out bench/results
    horovodrun -np 2 --gloo python -m bench.input_pipeline rank --data D --output O ...
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path
from typing import Any

import numpy as np

from bench.common import (
    base_parser,
    bench_dataset,
    horovod_command,
    interleave,
    job_throughput,
    machine_state,
    median,
    ratio,
    run_job,
    scratch,
    trainer_args,
    write_result,
)

NAME = "input_pipeline"


def make_tf_data(tf: Any, shard: Any, seed: int, rank: int, first_epoch: int) -> Any:
    """A ``make_sequence`` replacement: tf.data over the shard, ``shard.steps`` batches/epoch."""
    n = len(shard.labels)
    batch = -(-n // shard.steps)
    ds = tf.data.Dataset.from_tensor_slices((shard.images, shard.labels))
    ds = ds.shuffle(n, seed=seed + 1000 * rank + first_epoch, reshuffle_each_iteration=True)
    ds = ds.batch(batch).take(shard.steps).prefetch(tf.data.AUTOTUNE)
    ds.global_ids_of_epoch = lambda: shard.start + np.arange(n)  # for the run summary
    return ds


def rank_main(argv: list[str]) -> int:
    """The project's trainer with the tf.data input pipeline (run under horovodrun)."""
    from components.train import cli, trainer

    config = cli.parse_args(argv)
    trainer.make_sequence = make_tf_data  # type: ignore[assignment]
    return trainer.run(config)


def measure(
    data: str, work: Path, workers: int, module: str, label: str, epochs: int, round_no: int
) -> dict[str, Any]:
    """One pinned run of `workers` x 1 with the given rank program."""
    import json

    output = work / f"{label}-{workers}x1-r{round_no}"
    args = trainer_args(data, output, workers, epochs, threads=1)
    extra = ["rank"] if module == "bench.input_pipeline" else []
    run_job(horovod_command(workers, module, [*extra, *args], pin_threads=1))
    summary = json.loads((output / "run_summary.json").read_text())
    return {
        "examples_per_second": job_throughput(summary),
        "per_rank_examples_per_second": [r["examples_per_second"] for r in summary["per_rank"]],
    }


def run(train_samples: int, epochs: int, repeats: int, work: Path) -> dict[str, Any]:
    """Sequence and tf.data, at 1 x 1 and 2 x 1 pinned, interleaved."""
    data = bench_dataset(work, train_samples)
    machine_before = machine_state()
    variants = {}
    for workers in (1, 2):
        for label, module in (("sequence", "components.train"), ("tfdata", "bench.input_pipeline")):
            variants[f"{label}_{workers}x1p"] = functools.partial(
                measure, data, work, workers, module, label, epochs
            )
    runs = interleave(variants, repeats)
    medians = {k: median([r["examples_per_second"] for r in v]) for k, v in runs.items()}
    return {
        "settings": {
            "train_samples": train_samples,
            "epochs": epochs,
            "repeats": repeats,
            "pinned": "each process to its own core",
        },
        "machine_before": machine_before,
        "runs": runs,
        "median_examples_per_second": medians,
        "ratios": {
            "tfdata_over_sequence_1x1p": ratio(medians["tfdata_1x1p"], medians["sequence_1x1p"]),
            "tfdata_over_sequence_2x1p": ratio(medians["tfdata_2x1p"], medians["sequence_2x1p"]),
            "efficiency_sequence": ratio(medians["sequence_2x1p"], 2 * medians["sequence_1x1p"]),
            "efficiency_tfdata": ratio(medians["tfdata_2x1p"], 2 * medians["tfdata_1x1p"]),
        },
    }


def main(argv: list[str] | None = None) -> int:
    """CLI: the comparison, or ``rank TRAINER-ARGS`` under horovodrun."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["rank"]:
        return rank_main(argv[1:])
    p = base_parser(__doc__ or NAME)
    p.add_argument("--train-samples", type=int, default=20000)
    p.add_argument("--epochs", type=int, default=4)
    a = p.parse_args(argv)
    if a.quick:
        a.train_samples, a.epochs, a.repeats = 600, 2, 1
    result = run(a.train_samples, a.epochs, a.repeats, scratch(a.work, NAME))
    write_result(NAME, result, a.out)
    print(result["median_examples_per_second"], result["ratios"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
