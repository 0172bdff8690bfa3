"""The training input on a user's own images: what streaming costs, how close to decoding the
input runs, whether a rank's memory stays flat as the dataset grows, and whether data prep
scales out. Four figures, each a ratio of runs made side by side in this one benchmark:

- ``streaming``: 2x1 throughput of the trainer with its streamed TFRecord input against the
  same trainer fed from memory (its rank's block decoded into one tensor first, as it fed
  itself before: ``bench.variants --input memory``), interleaved round by round on the bundled
  digits (target: >= 0.97).
- ``input``: one rank's input pipeline (``components.train.rank.data.make_dataset``: read, parse,
  shuffle, batch, on one thread) on the dataset prepared from a generated folder of 64x64
  colour JPEGs, in images/s, against decoding those JPEGs alone on one core
  (``tf.io.decode_jpeg``, one thread) (target: >= 0.9). Beside it, the other way to store the
  images, encoded (each record the JPEG's bytes, decoded in the pipeline): its rate and its
  bytes on disk, against the prepared (decoded) records'.
- ``memory``: each rank's peak resident memory (the run summary's ``peak_rss_mb``) in a real
  2x1 job training one epoch of a small network on 10,000 and on 80,000 generated 96x96 colour
  images (8x), against the largest dataset's decoded size (target: growth <= 10%, and the
  dataset larger than a rank's peak).
- ``prep``: images per second of data prep's graph (the listing, the slices under
  ``dsl.ParallelFor``, the publishing: ``pipeline.pipeline.build_prep_pipeline``) in kfp.local
  on a generated folder of 64x64 colour JPEGs, ``prep_parallelism`` 1 against 2, interleaved;
  the slices' phase from kfp.local's own task lines, and the whole graph (target: >= 1.7 with
  2 on this 2-core machine).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import click
import numpy as np

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

NAME = "input_pipeline"
# The trainer's throughput is compared at the default model, batch and layout (2x1).
STREAM_TRAIN, STREAM_EPOCHS = 8000, 4
JPEG_SIDE, JPEG_QUALITY = 64, 90
MEMORY_SIDE, MEMORY_SIZES = 96, (10_000, 80_000)
# A network whose compute is small beside reading 96x96 colour images: the memory benchmark
# measures the input, not the model.
TINY_MODEL = "bench.input_pipeline:tiny_network"
TASK_LINE = re.compile(r"(\d\d):(\d\d):(\d\d\.\d+) - INFO - (Executing task|Task) '([^']+)'")


def tiny_network(input_shape: tuple[int, int, int], num_classes: int) -> Any:
    """The user's function of the memory benchmark: average colour, then a dense layer."""
    import keras

    return keras.Sequential(
        [
            keras.Input(shape=input_shape),
            keras.layers.GlobalAveragePooling2D(),
            keras.layers.Dense(num_classes, activation="softmax"),
        ]
    )


def jpeg_folder(root: Path, count: int, classes: int = 4, side: int = JPEG_SIDE) -> Path:
    """`count` generated colour JPEGs in `classes` class folders (kept if already there)."""
    from PIL import Image

    done = root / ".complete"
    if done.exists():
        return root
    rng = np.random.default_rng(11)
    for k in range(count):
        folder = root / f"class-{k % classes}"
        folder.mkdir(parents=True, exist_ok=True)
        level = 40 + 170 * (k % classes) / max(1, classes - 1)
        pixels = np.clip(level + rng.normal(0, 30, (side, side, 3)), 0, 255).astype(np.uint8)
        Image.fromarray(pixels).save(folder / f"{k:06d}.jpg", "JPEG", quality=JPEG_QUALITY)
    done.write_text("")
    return root


# 1. Streaming against memory ----------------------------------------------------------------


def streaming(work: Path, rounds: int, quick: bool) -> dict[str, Any]:
    train = 800 if quick else STREAM_TRAIN
    data = bench_dataset(work, train)
    epochs = 2 if quick else STREAM_EPOCHS

    def run(variant: str) -> Any:
        def one(round_no: int) -> dict[str, Any]:
            output = work / f"stream-{variant}-r{round_no}"
            args = ["--input", variant, "--", *trainer_args(data, output, 2, epochs, 1)]
            _, summary = run_trainer(2, args, module="bench.variants")
            return {"examples_per_second": job_throughput(summary)}

        return one

    runs = interleave({"stream": run("stream"), "memory": run("memory")}, rounds)
    per_round = [
        ratio(s["examples_per_second"], m["examples_per_second"])
        for s, m in zip(runs["stream"], runs["memory"], strict=True)
    ]
    return {
        "train_samples": train,
        "epochs": epochs,
        "runs": runs,
        "ratio_per_round": per_round,
        "stream_over_memory": median(per_round),
    }


# 2. The input against decoding ------------------------------------------------------------

INPUT_PROGRAM = """
import json, sys, time
import tensorflow as tf
tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(1)
from bench.input_pipeline import measure_input
print("RESULT " + json.dumps(measure_input(sys.argv[1], sys.argv[2], sys.argv[3])))
"""


def measure_input(folder: str, prepared: str, encoded: str) -> dict[str, Any]:
    """In a process of one thread: decoding the folder's JPEGs alone, the rank's input pipeline
    on the prepared dataset, and the encoded-records variant; images/s each (best of 3)."""
    import time

    import tensorflow as tf

    from components.common import dataset
    from components.train.rank.data import make_dataset, plan_rank

    files = [p.read_bytes() for p in sorted(Path(folder).rglob("*.jpg"))]

    def rate(run: Any, images: int) -> float:
        best = min(_seconds(run, time) for _ in range(3))
        return images / best

    def decode_alone() -> None:
        for data in files:
            tf.io.decode_jpeg(data, channels=3)

    manifest = dataset.read_manifest(prepared)
    plan = plan_rank(manifest, 64, 0, 1)

    def rank_input() -> None:
        for _ in make_dataset(tf, plan, 42, 0, range(1), 1):
            pass

    def encoded_input() -> None:
        for _ in _encoded_pipeline(tf, encoded, plan.image):
            pass

    return {
        "images": len(files),
        "decode_alone_per_second": rate(decode_alone, len(files)),
        "rank_input_per_second": rate(rank_input, plan.samples),
        "encoded_input_per_second": rate(encoded_input, plan.samples),
    }


def _seconds(run: Any, time: Any) -> float:
    started = time.perf_counter()
    run()
    return float(time.perf_counter() - started)


def _encoded_pipeline(tf: Any, path: str, image: Any) -> Any:
    """The encoded variant's reader: records of a JPEG's bytes, decoded per record."""
    options = tf.data.Options()
    options.threading.private_threadpool_size = 1

    def decode(record: Any) -> tuple[Any, Any]:
        features = tf.io.parse_single_example(
            record,
            {
                "image/encoded": tf.io.FixedLenFeature([], tf.string),
                "image/class/label": tf.io.FixedLenFeature([], tf.int64),
            },
        )
        pixels = tf.io.decode_jpeg(features["image/encoded"], channels=3)
        return tf.ensure_shape(pixels, image.shape), features["image/class/label"]

    return (
        tf.data.TFRecordDataset(path)
        .shuffle(1000, seed=1)
        .map(decode, num_parallel_calls=tf.data.AUTOTUNE)
        .batch(64)
        .prefetch(tf.data.AUTOTUNE)
        .with_options(options)
    )


def write_encoded(folder: Path, path: Path) -> int:
    """The folder's JPEGs as records of their own bytes (the encoded variant); its bytes."""
    from components.common import tfrecord

    with path.open("wb") as fh:
        writer = tfrecord.RecordWriter(fh)
        for f in sorted(folder.rglob("*.jpg")):
            label = int(f.parent.name.rsplit("-", 1)[1])
            record: dict[str, bytes | int] = {
                "image/encoded": f.read_bytes(),
                "image/class/label": label,
            }
            writer.write(tfrecord.example(record))
    return path.stat().st_size


def input_rates(work: Path, quick: bool) -> dict[str, Any]:
    from components.common import dataset
    from components.data_prep.prep import prepare

    count = 600 if quick else 6000
    folder = jpeg_folder(work / f"jpegs-{count}", count)
    prepared = work / f"jpegs-{count}-prepared"
    if not (prepared / dataset.MANIFEST).exists():
        prepare(str(folder), str(prepared), test_fraction=0.05, prep_parallelism=2)
    encoded = work / f"jpegs-{count}.tfrecord"
    encoded_bytes = write_encoded(folder, encoded)
    manifest = dataset.read_manifest(str(prepared))
    prepared_bytes = sum(Path(manifest.uri(s)).stat().st_size for s in manifest.shards("train"))
    command = [sys.executable, "-c", INPUT_PROGRAM, str(folder), str(prepared), str(encoded)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=1200, check=True)
    found = json.loads(next(x for x in done.stdout.splitlines() if x.startswith("RESULT "))[7:])
    jpeg_bytes = sum(p.stat().st_size for p in folder.rglob("*.jpg"))
    return {
        **found,
        "rank_input_over_decode": ratio(
            found["rank_input_per_second"], found["decode_alone_per_second"]
        ),
        "encoded_input_over_decode": ratio(
            found["encoded_input_per_second"], found["decode_alone_per_second"]
        ),
        "bytes_per_image": {
            "jpeg_files": round(jpeg_bytes / count),
            "prepared_decoded": round(prepared_bytes / manifest.count("train")),
            "encoded_records": round(encoded_bytes / count),
        },
    }


# 3. Memory flat in the dataset's size -------------------------------------------------------


def generated_dataset(root: Path, count: int, side: int = MEMORY_SIDE) -> str:
    """`count` generated colour images, `side` pixels square, in the prepared format, written
    by the project's own writer (the benchmark measures the reader, not data prep); kept."""
    from components.common import dataset, tfrecord

    out = root / f"generated-{count}-{side}"
    if (out / dataset.MANIFEST).exists():
        return str(out)
    rng = np.random.default_rng(3)
    shards, per_shard, classes = [], 2000, 4
    (out / "shards").mkdir(parents=True, exist_ok=True)
    for start in range(0, count, per_shard):
        rel = f"shards/train-{start // per_shard:05d}.tfrecord"
        with (out / rel).open("wb") as fh:
            writer = tfrecord.RecordWriter(fh)
            for k in range(start, min(count, start + per_shard)):
                pixels = rng.integers(0, 256, (side, side, 3), np.uint8).tobytes()
                record: dict[str, bytes | int] = {
                    "image/encoded": pixels,
                    "image/class/label": k % classes,
                }
                writer.write(tfrecord.example(record))
        shards.append({"location": rel, "count": writer.count, "sha256": writer.sha256})
    test = shards[:1]
    dataset.write_manifest(
        str(out),
        {
            "format": dataset.FORMAT,
            "image": {"height": side, "width": side, "channels": 3},
            "classes": [str(c) for c in range(classes)],
            "source": {"uri": "generated", "format": "generated"},
            "skipped": {"count": 0, "examples": []},
            "splits": {
                "train": {"count": count, "class_counts": {}, "shards": shards},
                "test": {"count": test[0]["count"], "class_counts": {}, "shards": test},
            },
        },
    )
    return str(out)


def memory(work: Path, quick: bool) -> dict[str, Any]:
    sizes = (1000, 8000) if quick else MEMORY_SIZES
    found: dict[str, Any] = {}
    for count in sizes:
        data = generated_dataset(work, count)
        output = work / f"memory-{count}"
        args = trainer_args(data, output, 2, 1, 1, model=TINY_MODEL, warmup_epochs=0)
        _, summary = run_trainer(2, args)
        found[str(count)] = {
            "peak_rss_mb": [r["peak_rss_mb"] for r in summary["per_rank"]],
            "decoded_mb": round(count * MEMORY_SIDE * MEMORY_SIDE * 3 / 2**20, 1),
        }
    small, large = (found[str(n)] for n in sizes)
    return {
        "images_side": MEMORY_SIDE,
        "by_size": found,
        "peak_growth": ratio(max(large["peak_rss_mb"]), max(small["peak_rss_mb"])),
        "largest_decoded_over_peak": ratio(large["decoded_mb"], max(large["peak_rss_mb"])),
    }


# 4. Data prep with 1 and 2 ParallelFor tasks ------------------------------------------------

PREP_PROGRAM = """
import sys
from kfp import local
from pipeline.pipeline import build_prep_pipeline
local.init(runner=local.SubprocessRunner(use_venv=False), pipeline_root=sys.argv[2])
build_prep_pipeline("bench/data-prep:local")(
    data_source=sys.argv[1], prep_parallelism=int(sys.argv[3]), shard_size=2000
)
"""


def prep_seconds(log: str) -> dict[str, float]:
    """The slices' phase and the whole graph, in seconds, from kfp.local's task lines."""
    stamps: dict[str, list[float]] = {}
    for line in log.splitlines():
        if m := TASK_LINE.search(re.sub(r"\x1b\[[0-9;]*m", "", line)):
            h, mi, s, _, task = m.groups()
            stamps.setdefault(task, []).append(int(h) * 3600 + int(mi) * 60 + float(s))
    every = [t for times in stamps.values() for t in times]
    slices = stamps["prepare-slice"]
    return {"slices": max(slices) - min(slices), "whole": max(every) - min(every)}


def prep_scaling(work: Path, rounds: int, quick: bool) -> dict[str, Any]:
    count = 800 if quick else 100_000
    folder = jpeg_folder(work / f"jpegs-{count}", count)

    def run(parallelism: int) -> Any:
        def one(round_no: int) -> dict[str, Any]:
            root = work / f"prep-{parallelism}-r{round_no}"
            command = [sys.executable, "-c", PREP_PROGRAM, str(folder), str(root), str(parallelism)]
            done = subprocess.run(command, capture_output=True, text=True, timeout=1800, check=True)
            seconds = prep_seconds(done.stdout + done.stderr)
            return {
                "seconds": seconds,
                "images_per_second": count / seconds["slices"],
                "images_per_second_whole": count / seconds["whole"],
            }

        return one

    runs = interleave({"1": run(1), "2": run(2)}, rounds)

    def speedup(key: str) -> list[float]:
        return [ratio(two[key], one[key]) for one, two in zip(runs["1"], runs["2"], strict=True)]

    return {
        "images": count,
        "runs": runs,
        "speedup_per_round": speedup("images_per_second"),
        "speedup": median(speedup("images_per_second")),
        "speedup_whole": median(speedup("images_per_second_whole")),
    }


@click.command(help=__doc__.split("\n\n")[0])
@bench_options
@click.option(
    "--only",
    default="streaming,input,memory,prep",
    show_default=True,
    help="comma-separated parts",
)
def command(out: Path, work: Path | None, repeats: int, quick: bool, only: str) -> int:
    scratch_dir = scratch(work, NAME)
    rounds = 1 if quick else max(5, repeats)
    parts = only.split(",")
    result: dict[str, Any] = {"machine_before": machine_state()}
    if "streaming" in parts:
        result["streaming"] = streaming(scratch_dir, rounds, quick)
    if "input" in parts:
        result["input"] = input_rates(scratch_dir, quick)
    if "memory" in parts:
        result["memory"] = memory(scratch_dir, quick)
    if "prep" in parts:
        result["prep"] = prep_scaling(scratch_dir, 1 if quick else 3, quick)
    write_result(NAME, result, out)
    return 0


def main(argv: list[str] | None = None) -> int:
    return bench_main(command, argv, "bench.input_pipeline")


if __name__ == "__main__":
    sys.exit(main())
