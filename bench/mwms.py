"""Horovod against the alternative users would pick: TF's MultiWorkerMirroredStrategy.

Both at 2 workers x 1 thread on localhost, same model (the trainer's default, or ``--model``),
same data (each
worker reads the same disjoint shard as the trainer's rank), same per-worker batch, same
steps per epoch and epochs, same optimizer (Adam, learning rate scaled by 2). Horovod is the
project's trainer under ``horovodrun --gloo``; MWMS is two processes with a ``TF_CONFIG`` of
two localhost ports (ring all-reduce), feeding ``tf.data`` through ``DatasetCreator`` (MWMS
cannot shard a Keras Sequence per worker). Throughput is examples/s of the whole job from
the median epoch after the first, for both. Run one MWMS worker by hand with::

    TF_CONFIG=... python -m bench.mwms worker --data D --epochs 4 --result worker0.json
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
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
    model_fields,
    model_option,
    ratio,
    run_trainer,
    scratch,
    trainer_args,
    write_result,
)
from components.common.defaults import BATCH_SIZE_PER_WORKER, MODEL, SHUFFLE_SEED
from components.common.failure import ExitCode

NAME = "mwms"
WORKERS = 2


def free_ports(count: int) -> list[int]:
    """`count` TCP ports on localhost that were free a moment ago."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("localhost", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def tf_config(ports: list[int], index: int) -> str:
    """The ``TF_CONFIG`` of worker `index` in a cluster of localhost `ports`."""
    cluster = {"worker": [f"localhost:{p}" for p in ports]}
    return json.dumps({"cluster": cluster, "task": {"type": "worker", "index": index}})


def _epoch_timer(keras: Any, seconds: list[float]) -> Any:
    """A callback appending each epoch's seconds to `seconds`."""

    class EpochTimer(keras.callbacks.Callback):  # type: ignore[misc, name-defined]
        def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
            self.t0 = time.perf_counter()

        def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
            seconds.append(time.perf_counter() - self.t0)

    return EpochTimer()


def _worker_dataset(tf: Any, images: Any, labels: Any, seed: int, batch_size: int) -> Any:
    """This worker's shard, already split by worker: Keras 3 distributes it over the strategy
    (one replica per worker) without sharding it again."""
    ds = tf.data.Dataset.from_tensor_slices((images, labels))
    ds = ds.shuffle(len(labels), seed=seed).repeat().batch(batch_size).prefetch(2)
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    return ds.with_options(options)


def worker(
    data: str,
    epochs: int,
    batch_size: int,
    threads: int,
    seed: int,
    result: Path,
    model_name: str | None = None,
) -> None:
    """One MWMS worker: train the project's model on this worker's shard, write epoch times."""
    from components.common import dataset, keras_env
    from components.common.shard_files import read_split_arrays
    from components.train.rank.data import shard_range, steps_per_epoch
    from components.train.rank.model import build_model

    tf, keras = keras_env.tensorflow(), keras_env.keras()
    tf.config.threading.set_intra_op_parallelism_threads(threads)
    tf.config.threading.set_inter_op_parallelism_threads(max(1, min(2, threads)))
    options = tf.distribute.experimental.CommunicationOptions(
        implementation=tf.distribute.experimental.CommunicationImplementation.RING
    )
    strategy = tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)
    index, size = strategy.cluster_resolver.task_id, strategy.num_replicas_in_sync
    manifest = dataset.read_manifest(data)
    total = manifest.count("train")
    start, stop = shard_range(total, index, size)
    images, labels = read_split_arrays(tf, manifest, "train")  # the bench's reference: in memory
    images, labels = images[start:stop], labels[start:stop]
    steps = steps_per_epoch(total, size, batch_size)

    ds = _worker_dataset(tf, images, labels, seed + index, batch_size)
    with strategy.scope():
        model = build_model(seed, model_name or MODEL)
        model.compile(
            optimizer=keras.optimizers.Adam(learning_rate=0.001 * size),
            loss="sparse_categorical_crossentropy",
            metrics=["accuracy"],
        )
    seconds: list[float] = []
    history = model.fit(
        ds,
        epochs=epochs,
        steps_per_epoch=steps,
        callbacks=[_epoch_timer(keras, seconds)],
        verbose=0,
    )
    timed = seconds[1:] or seconds
    samples = steps * batch_size
    result.write_text(
        json.dumps(
            {
                "index": index,
                "epoch_seconds": seconds,
                "examples_per_second": round(samples / float(median(timed)), 1),
                "final_accuracy": float(history.history["accuracy"][-1]),
            }
        )
    )


def measure_mwms(
    data: str, work: Path, epochs: int, model: str | None, round_no: int
) -> dict[str, Any]:
    """Two MWMS worker processes on localhost; job throughput = 2 x the slower worker's."""
    ports = free_ports(WORKERS)
    out = work / f"mwms-r{round_no}"
    out.mkdir(parents=True, exist_ok=True)
    procs = []
    started = time.monotonic()
    for index in range(WORKERS):
        env = dict(os.environ, TF_CONFIG=tf_config(ports, index), TF_CPP_MIN_LOG_LEVEL="2")
        command = [
            sys.executable, "-m", "bench.mwms", "worker", "--data", data,
            "--epochs", str(epochs), "--result", str(out / f"worker{index}.json"),
            *(["--model", model] if model else []),
        ]  # fmt: skip
        log = (out / f"worker{index}.log").open("w")
        procs.append(subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT))
    try:
        codes = [p.wait(timeout=900) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    if any(codes):
        raise RuntimeError(f"MWMS workers exited with {codes}; see {out}/worker*.log")
    workers = [json.loads((out / f"worker{i}.json").read_text()) for i in range(WORKERS)]
    rates = [w["examples_per_second"] for w in workers]
    return {
        "examples_per_second": WORKERS * min(rates),
        "per_worker_examples_per_second": rates,
        "wall_seconds": round(time.monotonic() - started, 2),
        "final_accuracy": workers[0]["final_accuracy"],
    }


def measure_horovod(
    data: str, work: Path, epochs: int, model: str | None, round_no: int
) -> dict[str, Any]:
    """The project's trainer, 2 ranks x 1 thread."""
    output = work / f"horovod-r{round_no}"
    started = time.monotonic()
    args = trainer_args(data, output, WORKERS, epochs, threads=1, **model_fields(model))
    _, summary = run_trainer(WORKERS, args)
    return {
        "examples_per_second": job_throughput(summary),
        "per_worker_examples_per_second": [r["examples_per_second"] for r in summary["per_rank"]],
        "wall_seconds": round(time.monotonic() - started, 2),
        "final_accuracy": summary["final_metrics"].get("accuracy"),
    }


def run(
    train_samples: int, epochs: int, repeats: int, work: Path, model: str | None = None
) -> dict[str, Any]:
    """Horovod and MWMS, interleaved, `repeats` rounds."""
    data = bench_dataset(work, train_samples)
    machine_before = machine_state()
    runs = interleave(
        {
            "horovod": lambda r: measure_horovod(data, work, epochs, model, r),
            "mwms": lambda r: measure_mwms(data, work, epochs, model, r),
        },
        repeats,
    )
    medians = {k: median([r["examples_per_second"] for r in v]) for k, v in runs.items()}
    walls = {k: median([r["wall_seconds"] for r in v]) for k, v in runs.items()}
    return {
        "settings": {
            "model": model or MODEL,
            "workers": WORKERS,
            "threads_per_worker": 1,
            "batch_size_per_worker": BATCH_SIZE_PER_WORKER,
            "train_samples": train_samples,
            "epochs": epochs,
            "repeats": repeats,
            "mwms_collective": "RING (gRPC, localhost)",
            "horovod_collective": "Gloo (horovodrun --gloo, localhost)",
        },
        "machine_before": machine_before,
        "runs": runs,
        "median_examples_per_second": medians,
        "median_wall_seconds": walls,
        "ratios": {
            "horovod_over_mwms_throughput": ratio(medians["horovod"], medians["mwms"]),
            "mwms_over_horovod_wall": ratio(walls["mwms"], walls["horovod"]),
        },
    }


# Measured on TF 2.21 with Keras 3.15: `fit` under the strategy fails, first building the model
# from a batch reduced over the workers ("unsupported type PerReplica"), and with the model built
# beforehand in the loss's reduction ("Invalid reduction dimension 0 for input with 0
# dimensions"). keras#20585 and tensorflow#72388 report the same.
KERAS_3_REFUSAL = (
    "bench.mwms: MultiWorkerMirroredStrategy's fit fails under Keras 3 (keras#20585, "
    "tensorflow#72388); its figures in docs/performance.md are from the tf-keras stack"
)


def keras_major() -> int:
    from components.common import keras_env

    return int(keras_env.keras().__version__.split(".")[0])


@click.group(help=__doc__, invoke_without_command=True)
@bench_options
@click.option("--train-samples", type=int, default=20000, show_default=True)
@click.option("--epochs", type=int, default=4, show_default=True, help="the first one is not timed")
@model_option
@click.pass_context
def command(
    ctx: click.Context,
    out: Path,
    work: Path | None,
    repeats: int,
    quick: bool,
    train_samples: int,
    epochs: int,
    model: str | None,
) -> int | None:
    """The comparison (``python -m bench.mwms``), unless a worker is asked for."""
    if ctx.invoked_subcommand is not None:
        return None
    if keras_major() >= 3:
        print(KERAS_3_REFUSAL, file=sys.stderr)
        return ExitCode.BAD_INPUT
    if quick:
        train_samples, epochs, repeats = 600, 2, 1
    result = run(train_samples, epochs, repeats, scratch(work, NAME), model)
    write_result(NAME, result, out)
    print(result["median_examples_per_second"], result["ratios"])
    return 0


@command.command("worker", hidden=True)  # one MWMS worker: the comparison starts two
@click.option("--data", required=True)
@click.option("--epochs", type=int, default=4, show_default=True)
@click.option("--batch-size", type=int, default=BATCH_SIZE_PER_WORKER, show_default=True)
@click.option("--threads", type=int, default=1, show_default=True)
@click.option("--seed", type=int, default=SHUFFLE_SEED, show_default=True)
@click.option("--result", type=click.Path(dir_okay=False, path_type=Path), required=True)
@click.option("--model", default=None)
def worker_command(
    data: str,
    epochs: int,
    batch_size: int,
    threads: int,
    seed: int,
    result: Path,
    model: str | None,
) -> int:
    worker(data, epochs, batch_size, threads, seed, result, model)
    return 0


def main(argv: list[str] | None = None) -> int:
    """CLI: ``python -m bench.mwms`` (the comparison) or ``python -m bench.mwms worker ...``."""
    return bench_main(command, argv, "bench.mwms")


if __name__ == "__main__":
    sys.exit(main())
