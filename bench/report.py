"""Turn ``bench/results/*.json`` into ``summary.md`` (the README's table) and ``scaling.png``."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

TARGETS = {
    "efficiency": 0.90,
    "time_to_accuracy": 1.8,
    "horovod_over_mwms": 1.0,
    "not_training_share": 0.15,
}


def load(results: Path) -> dict[str, dict[str, Any]]:
    """Every ``<name>.json`` in `results`, by benchmark name."""
    return {p.stem: json.loads(p.read_text()) for p in sorted(results.glob("*.json"))}


def _verdict(ok: bool | None) -> str:
    return "n/a" if ok is None else ("met" if ok else "**missed**")


def _fmt(x: Any, digits: int = 2) -> str:
    if isinstance(x, float):
        return "nan" if math.isnan(x) else f"{x:,.{digits}f}"
    return str(x)


def _capacity(r: dict[str, Any]) -> str:
    cap = r.get("machine_before", {}).get("cpu_capacity", {}).get("effective_cores_of_2")
    return f"{cap}" if cap is not None else "?"


def target_rows(res: dict[str, dict[str, Any]]) -> list[list[str]]:
    """The headline table: one row per target."""
    rows: list[list[str]] = []
    if s := res.get("scaling"):
        m = s["median_examples_per_second"]
        if (eff := s["ratios"].get("efficiency_2x1")) is not None:
            rows.append(
                [
                    "1. Scaling efficiency T(2)/(2·T(1)), 1 thread each",
                    f"{_fmt(eff)} ({_fmt(m.get('2x1'), 0)} vs {_fmt(m.get('1x1'), 0)} ex/s)",
                    "≥ 0.90",
                    _verdict(eff >= TARGETS["efficiency"]),
                ]
            )
        if (effp := s["ratios"].get("efficiency_2x1p")) is not None:
            rows.append(
                [
                    "1. Same, each process pinned to its own core (taskset-style)",
                    f"{_fmt(effp)} ({_fmt(m.get('2x1p'), 0)} vs {_fmt(m.get('1x1p'), 0)} ex/s)",
                    "≥ 0.90",
                    _verdict(effp >= TARGETS["efficiency"]),
                ]
            )
        if "2x1_over_1x2" in s["ratios"]:
            rows.append(
                [
                    "1. 2 processes × 1 thread vs 1 process × 2 threads",
                    f"{_fmt(s['ratios']['2x1_over_1x2'])}× ({_fmt(m.get('1x2'), 0)} ex/s for 1×2)",
                    "(which to pick)",
                    "",
                ]
            )
    for name, r in res.items():
        if not name.startswith("scaling_") or "settings" not in r:
            continue
        m = r["median_examples_per_second"]
        batch = r["settings"]["batch_size_per_worker"]
        for key, value in r["ratios"].items():
            if key.startswith("efficiency_"):
                layout = key.removeprefix("efficiency_")
                base = "1x1p" if layout.endswith("p") else "1x1"
                rows.append(
                    [
                        f"1. Efficiency {layout} at per-worker batch {batch} (`{name}`, run apart)",
                        f"{_fmt(value)} ({_fmt(m.get(layout), 0)} vs {_fmt(m.get(base), 0)} ex/s)",
                        "(what a bigger batch buys)",
                        "",
                    ]
                )
    if ip := res.get("input_pipeline"):
        q = ip["ratios"]
        rows.append(
            [
                "1. tf.data / Keras Sequence input, 1×1p and 2×1p (`input_pipeline`, measured "
                "before the trainer moved to tf.data)",
                f"{_fmt(q['tfdata_over_sequence_1x1p'])}× and "
                f"{_fmt(q['tfdata_over_sequence_2x1p'])}×"
                f" (efficiency {_fmt(q['efficiency_tfdata'])} vs {_fmt(q['efficiency_sequence'])})",
                "(profile)",
                "",
            ]
        )
    if t := res.get("time_to_accuracy"):
        target = t["settings"]["target_test_accuracy"]
        w, tr = t["speedup_wall"], t["speedup_training"]
        rows.append(
            [
                f"2. Time to {target:.0%} test accuracy: 2×1 job vs 1 process (wall, from launch)",
                f"{_fmt(w['horovod_2x1_vs_one_process'])}× "
                f"(training only: {_fmt(tr['horovod_2x1_vs_one_process'])}×)",
                "≥ 1.8×",
                _verdict(w["horovod_2x1_vs_one_process"] >= TARGETS["time_to_accuracy"]),
            ]
        )
        rows.append(
            [
                "2. Same, 2 independent copies (world size 1 each) vs 1 process",
                f"{_fmt(w['two_copies_vs_one_process'])}× "
                f"(our job vs copies: {_fmt(w['horovod_2x1_vs_two_copies'])}×)",
                "(failure mode)",
                "",
            ]
        )
        acc = t["sampling_median_test_accuracy"]
        rows.append(
            [
                f"2. Test accuracy after {t['settings']['sampling_epochs']} epochs, 2 ranks: "
                "disjoint shards vs 2019 random sampling",
                f"{_fmt(acc['disjoint_shards'], 4)} vs {_fmt(acc['random_2019'], 4)}",
                "(compare)",
                "",
            ]
        )
    if mw := res.get("mwms"):
        r = mw["ratios"]["horovod_over_mwms_throughput"]
        m = mw["median_examples_per_second"]
        rows.append(
            [
                "3. Horovod / MultiWorkerMirroredStrategy throughput, 2×1",
                f"{_fmt(r)} ({_fmt(m['horovod'], 0)} vs {_fmt(m['mwms'], 0)} ex/s)",
                "≥ 1.0",
                _verdict(r >= TARGETS["horovod_over_mwms"]),
            ]
        )
    if a := res.get("allreduce"):
        g = a["gradients"]
        rows.append(
            [
                "4. Peak allreduce bus bandwidth / memcpy bandwidth",
                f"{_fmt(a['peak_busbw_over_memcpy'], 3)} "
                f"({_fmt(a['peak_busbw_gb_s'])} vs {_fmt(a['memcpy_gb_s'])} GB/s)",
                "(ceiling)",
                "",
            ]
        )
        tl = a.get("timeline")
        if tl:
            rows.append(
                [
                    f"4. Communication share of a 2×1 step ({g['bytes'] / 1e3:,.0f} KB grads)",
                    f"allreduce {_fmt(a['step']['gradient_allreduce_share_of_step'])}; "
                    "timeline: Gloo "
                    f"{_fmt(tl['gloo_allreduce_share_of_step'])}, waiting "
                    f"{_fmt(tl['negotiate_share_of_step'])} of a {_fmt(tl['step_ms'], 1)} ms step",
                    "(profile)",
                    "",
                ]
            )
    if d := res.get("data_prep"):
        big = d["rows"][-1]
        rows.append(
            [
                f"5. Data prep of {big['train_samples']:,} samples vs raw copy",
                f"{_fmt(big['prepare_mb_s'], 0)} vs {_fmt(big['copy_mb_s'], 0)} MB/s; "
                f"R² of linear fit {_fmt(d['linear_fit']['r_squared'], 4)}",
                "linear",
                _verdict(d["linear_fit"]["r_squared"] >= 0.99),
            ]
        )
    if p := res.get("pipeline_overhead"):
        for name, m in p["medians"].items():
            share = m["not_training_share"]
            rows.append(
                [
                    f"6. `make run` ({name}): share of wall time that is not training",
                    f"{_fmt(share)} of {_fmt(m['total_seconds'], 1)} s "
                    f"(not the train step: {_fmt(m['not_train_task_share'])})",
                    "< 0.15",
                    _verdict(share < TARGETS["not_training_share"]),
                ]
            )
    return rows


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return lines


def summary_markdown(res: dict[str, dict[str, Any]]) -> str:
    """The Markdown summary: targets, then one small table per benchmark."""
    hw = next(iter(res.values()))["hardware"] if res else {}
    out = [
        "# Benchmark results",
        "",
        f"Measured on {hw.get('cpu_model', '?')}, {hw.get('cores', '?')} cores, "
        f"{hw.get('memory_gib', '?')} GiB; TensorFlow {hw.get('tensorflow', '?')}, Horovod "
        f"{hw.get('horovod', '?')} (Gloo), Python {hw.get('python', '?')}. Every figure is a "
        "median of repeated runs; every comparison was measured side by side in one run "
        "(variants interleaved) and is given as a ratio. Regenerate with `make bench`.",
        "",
    ]
    out += _table(["What", "Measured", "Target", "Verdict"], target_rows(res))
    out += [
        "",
        "Effective cores of 2 measured before each benchmark (2.0 = both free; a shared machine "
        "gives less; above 2 is noise of the 0.3 s probe): ",
    ]
    out += [", ".join(f"{name} {_capacity(r)}" for name, r in res.items()), ""]
    if s := res.get("scaling"):
        out += ["## 1. Scaling (examples/s, median)", ""]
        out += _table(
            ["Layout (processes × threads)", "Examples/s", "Per rank"],
            [
                [k, _fmt(v, 0), ", ".join(_fmt(x, 0) for x in _median_per_rank(s, k))]
                for k, v in s["median_examples_per_second"].items()
            ],
        )
        out += ["", "![throughput against workers](scaling.png)", ""]
    if t := res.get("time_to_accuracy"):
        out += ["## 2. Time to accuracy (seconds, median)", ""]
        out += _table(
            ["Variant", "Wall, from launch", "Training only"],
            [
                [k, _fmt(v, 1), _fmt(t["median_training_seconds_to_target"][k], 1)]
                for k, v in t["median_wall_seconds_to_target"].items()
            ],
        )
        out.append("")
    if a := res.get("allreduce"):
        out += ["## 4. Allreduce (Gloo, 2 ranks, loopback)", ""]
        out += _table(
            ["Size", "Time (ms)", "Bus bandwidth (GB/s)", "Of memcpy"],
            [
                [
                    _size(r["bytes"]),
                    _fmt(r["seconds"] * 1e3, 3),
                    _fmt(r["busbw_gb_s"], 3),
                    _fmt(r["fraction_of_memcpy"], 3),
                ]
                for r in a["allreduce"]
            ],
        )
        out += ["", f"memcpy: {_fmt(a['memcpy_gb_s'])} GB/s", ""]
    if d := res.get("data_prep"):
        out += ["## 5. Data prep", ""]
        out += _table(
            ["Train samples", "Input MB", "prepare() s", "copy s", "prepare MB/s", "µs/sample"],
            [
                [
                    f"{r['train_samples']:,}",
                    _fmt(r["input_mb"], 1),
                    _fmt(r["prepare_seconds"], 3),
                    _fmt(r["copy_seconds"], 3),
                    _fmt(r["prepare_mb_s"], 0),
                    _fmt(r["microseconds_per_sample"], 2),
                ]
                for r in d["rows"]
            ],
        )
        out.append("")
    if p := res.get("pipeline_overhead"):
        out += ["## 6. `make run` wall time by step (seconds, median)", ""]
        for name, m in p["medians"].items():
            rows = [[k, _fmt(v, 2), _fmt(m["task_share"][k])] for k, v in m["task_seconds"].items()]
            rows.append(
                [
                    "orchestration",
                    _fmt(m["orchestration_seconds"], 2),
                    _fmt(m["orchestration_share"]),
                ]
            )
            rows.append(["training proper (inside train)", _fmt(m["training_seconds"], 2), ""])
            out += [f"**{name}** (total {_fmt(m['total_seconds'], 1)} s)", ""]
            out += _table(["Step", "Seconds", "Share"], rows)
            out.append("")
    return "\n".join(out) + "\n"


def _median_per_rank(s: dict[str, Any], layout: str) -> list[float]:
    import statistics

    runs = s["runs"][layout]
    ranks = len(runs[0]["per_rank_examples_per_second"])
    return [
        statistics.median(r["per_rank_examples_per_second"][i] for r in runs) for i in range(ranks)
    ]


def _size(n: int) -> str:
    return f"{n // 2**20} MB" if n >= 2**20 else f"{n // 1024} KB"


def scaling_plot(scaling: dict[str, Any], path: Path) -> Path:
    """Throughput against workers (1 thread each), with the ideal line and 1 x T points."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from bench.scaling import parse_layout

    medians: dict[str, float] = scaling["median_examples_per_second"]
    fig, ax = plt.subplots(figsize=(6, 4), dpi=100)
    for pinned, style, label in ((False, "o-", "not pinned"), (True, "^-", "pinned, 1 core each")):
        points = sorted(
            (w, v)
            for k, v in medians.items()
            for w, t, p in [parse_layout(k)]
            if t == 1 and p == pinned
        )
        if not points:
            continue
        xs, ys = zip(*points, strict=True)
        line = ax.plot(xs, ys, style, label=f"Horovod, N processes × 1 thread, {label}")
        base = dict(points).get(1)
        if base and len(xs) > 1:
            ax.plot(xs, [base * x for x in xs], ":", color=line[0].get_color(), label="ideal")
    for k, v in medians.items():
        workers, threads, _ = parse_layout(k)
        if workers == 1 and threads > 1:
            ax.plot([threads], [v], "s", label=f"1 process × {threads} threads")
    ax.set_xlabel("processes (or threads, for the square)")
    ax.set_ylabel("examples/s (median)")
    ax.set_title("Training throughput on this machine")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def write_report(results: Path) -> list[Path]:
    """Write ``summary.md`` and, if scaling ran, ``scaling.png`` into `results`."""
    res = load(results)
    written = [results / "summary.md"]
    written[0].write_text(summary_markdown(res))
    if "scaling" in res:
        written.append(scaling_plot(res["scaling"], results / "scaling.png"))
    return written
