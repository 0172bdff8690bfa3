"""Horovod allreduce against the machine's limit, and communication's share of a step.

1. Bus bandwidth of ``hvd.allreduce`` (Gloo, 2 ranks, loopback) for float32 tensors of 4 KB
   to 64 MB: ``busbw = bytes / time x 2 (n - 1) / n`` (the nccl-tests convention: what each
   link carries), against a plain memory copy of 64 MB (``numpy.copyto``, bytes / time), the
   physical ceiling here.
2. The gradients of the model (the trainer's default, or ``--model``) in bytes, allreduced
   the way DistributedOptimizer does (one fused grouped allreduce), against the step time of
   a 2 x 1 training run of that model.
3. The Horovod timeline (``HOROVOD_TIMELINE``) of a real 2 x 1 training run: time per step in
   the Gloo allreduce itself and time spent waiting for the other rank (negotiation).
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.common import (
    add_model_option,
    base_parser,
    bench_dataset,
    build_bench_model,
    default_model,
    horovod_command,
    machine_state,
    median,
    model_fields,
    ratio,
    run_job,
    run_trainer,
    scratch,
    trainer_args,
    write_result,
)
from components.common.defaults import SHUFFLE_SEED

NAME = "allreduce"
WORKERS = 2
SIZES = [4 * 1024 * 4**k for k in range(8)]  # 4 KB .. 64 MB
QUICK_SIZES = [4 * 1024, 64 * 1024]


def _time_allreduce(hvd: Any, tensors: list[Any], iterations: int) -> float:
    """Median seconds of one grouped allreduce of `tensors` (after 3 warm-up calls)."""
    for _ in range(3):
        hvd.grouped_allreduce(tensors, op=hvd.Sum)
    barrier = getattr(hvd, "barrier", None)
    times = []
    for _ in range(iterations):
        if barrier is not None:
            barrier()  # start together: time the allreduce, not the other rank's lag
        t0 = time.perf_counter()
        out = hvd.grouped_allreduce(tensors, op=hvd.Sum)
        _ = out[0].numpy()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def rank_program(sizes: list[int], result: Path, model_name: str | None = None) -> None:
    """Run under horovodrun: time allreduce per size and for the model's gradients."""
    from components.common import keras_env

    keras_env.keras()  # Keras 2 first: importing horovod.tensorflow binds tf.keras (issue 12)
    import horovod.tensorflow as hvd
    import tensorflow as tf

    hvd.init()
    tf.config.threading.set_intra_op_parallelism_threads(1)
    n = hvd.size()
    rows = []
    for size in sizes:
        tensor = tf.ones([size // 4], dtype=tf.float32)
        iterations = int(min(200, max(10, 2**26 // size)))
        seconds = _time_allreduce(hvd, [tensor], iterations)
        rows.append(
            {
                "bytes": size,
                "seconds": seconds,
                "algbw_gb_s": size / seconds / 1e9,
                "busbw_gb_s": size / seconds / 1e9 * 2 * (n - 1) / n,
                "iterations": iterations,
            }
        )
    model = build_bench_model(model_name, SHUFFLE_SEED)
    grads = [tf.ones_like(w) for w in model.trainable_weights]
    grad_bytes = int(sum(int(np.prod(w.shape)) * 4 for w in model.trainable_weights))
    grad_seconds = _time_allreduce(hvd, grads, 200)
    if hvd.rank() == 0:
        result.write_text(
            json.dumps(
                {
                    "sizes": rows,
                    "gradients": {
                        "tensors": len(grads),
                        "bytes": grad_bytes,
                        "allreduce_seconds": grad_seconds,
                    },
                }
            )
        )


def memcpy_bandwidth(size: int = 64 * 2**20, repeats: int = 20) -> float:
    """GB/s of ``numpy.copyto`` between two `size`-byte buffers (bytes copied / time)."""
    src = np.ones(size, dtype=np.uint8)
    dst = np.empty_like(src)
    np.copyto(dst, src)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        times.append(time.perf_counter() - t0)
    return size / median(times) / 1e9


def timeline_profile(path: Path) -> dict[str, float]:
    """Median milliseconds per occurrence of each Horovod timeline activity (rank 0's view).

    Tensors fused into one operation share one ``GLOO_ALLREDUCE`` (the data movement, once
    per step); ``NEGOTIATE_ALLREDUCE`` is the wait, per tensor, until every rank has it ready.
    """
    raw = path.read_text().rstrip().rstrip(",")
    events = json.loads(raw if raw.endswith("]") else raw + "]")
    open_: dict[Any, list[tuple[str, float]]] = collections.defaultdict(list)
    spans: dict[str, dict[float, float]] = collections.defaultdict(dict)
    for e in events:
        if e.get("ph") == "B":
            open_[e.get("pid")].append((e["name"], e["ts"]))
        elif e.get("ph") == "E" and open_[e.get("pid")]:
            name, t0 = open_[e.get("pid")].pop()
            spans[name][t0] = max(spans[name].get(t0, 0.0), e["ts"] - t0)
    return {
        f"{name}_median_ms": round(median(list(d.values())) / 1000, 3)
        for name, d in sorted(spans.items())
        if name.endswith("ALLREDUCE")
    }


def run(
    sizes: list[int],
    train_samples: int,
    epochs: int,
    work: Path,
    timeline: bool = True,
    model: str | None = None,
) -> dict[str, Any]:
    """All three measurements (the third only if `timeline`)."""
    machine_before = machine_state()
    raw = work / "allreduce-rank0.json"
    rank_args = ["rank", "--sizes", ",".join(map(str, sizes)), str(raw)]
    run_job(horovod_command(WORKERS, "bench.allreduce", rank_args + model_option(model)))
    measured = json.loads(raw.read_text())
    copy_gb_s = memcpy_bandwidth()
    for row in measured["sizes"]:
        row["fraction_of_memcpy"] = round(row["busbw_gb_s"] / copy_gb_s, 4)

    grads = measured["gradients"]
    result: dict[str, Any] = {
        "settings": {
            "model": model or default_model(),
            "workers": WORKERS,
            "transport": "Gloo over loopback (horovodrun --gloo -H localhost:2)",
            "sizes_bytes": sizes,
            "memcpy_bytes": 64 * 2**20,
            "timeline_run": {"train_samples": train_samples, "epochs": epochs, "threads": 1},
        },
        "machine_before": machine_before,
        "allreduce": measured["sizes"],
        "memcpy_gb_s": round(copy_gb_s, 3),
        "peak_busbw_gb_s": round(max(r["busbw_gb_s"] for r in measured["sizes"]), 3),
        "peak_busbw_over_memcpy": ratio(max(r["busbw_gb_s"] for r in measured["sizes"]), copy_gb_s),
        "gradients": grads,
    }
    if timeline:
        result.update(timeline_run(work, train_samples, epochs, grads["allreduce_seconds"], model))
    return result


def model_option(model: str | None) -> list[str]:
    """``--model NAME`` for a rank program, or nothing for the trainer's default."""
    return ["--model", model] if model else []


def timeline_run(
    work: Path,
    train_samples: int,
    epochs: int,
    grad_allreduce_seconds: float,
    model: str | None = None,
) -> dict[str, Any]:
    """A 2 x 1 training run with HOROVOD_TIMELINE: step time and communication's share."""
    data = bench_dataset(work, train_samples)
    timeline = work / "timeline.json"
    output = work / "timeline-run"
    _, summary = run_trainer(
        WORKERS,
        trainer_args(data, output, WORKERS, epochs, threads=1, **model_fields(model)),
        env={"HOROVOD_TIMELINE": str(timeline)},
    )
    rate = min(r["examples_per_second"] for r in summary["per_rank"])
    step_seconds = summary["batch_size_per_worker"] / rate
    profile = timeline_profile(timeline)
    gloo_ms = profile.get("GLOO_ALLREDUCE_median_ms", float("nan"))
    wait_ms = profile.get("NEGOTIATE_ALLREDUCE_median_ms", float("nan"))
    return {
        "step": {
            "step_seconds_2x1": round(step_seconds, 5),
            "gradient_allreduce_share_of_step": ratio(grad_allreduce_seconds, step_seconds),
        },
        "timeline": {
            **profile,
            "step_ms": round(step_seconds * 1000, 3),
            "gloo_allreduce_share_of_step": ratio(gloo_ms / 1000, step_seconds),
            "negotiate_share_of_step": ratio(wait_ms / 1000, step_seconds),
            "note": "measured with the timeline on, which itself costs a little",
        },
    }


def main(argv: list[str] | None = None) -> int:
    """CLI: ``python -m bench.allreduce`` (or ``rank --sizes ... RESULT`` under horovodrun)."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["rank"]:
        r = argparse.ArgumentParser(prog="python -m bench.allreduce rank")
        r.add_argument("--sizes", required=True)
        r.add_argument("result", type=Path)
        r.add_argument("--model", default=None)
        a = r.parse_args(argv[1:])
        rank_program([int(s) for s in a.sizes.split(",")], a.result, a.model)
        return 0
    p = base_parser(__doc__ or NAME)
    p.add_argument("--train-samples", type=int, default=20000)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--no-timeline", action="store_true", help="skip the profiled training run")
    add_model_option(p)
    a = p.parse_args(argv)
    sizes = SIZES
    if a.quick:
        sizes, a.train_samples, a.epochs = QUICK_SIZES, 600, 1
    work = scratch(a.work, NAME)
    result = run(sizes, a.train_samples, a.epochs, work, not a.no_timeline, a.model)
    write_result(NAME, result, a.out)
    print(result["peak_busbw_over_memcpy"], result["gradients"], result.get("timeline"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
