"""Turn ``bench/results/*.json`` into ``summary.md`` (the README's table) and ``scaling.png``."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from bench.plots import scaling_plot, time_to_accuracy_plot

# Issue 10's targets (2 cores, the default model) and issue 6's pipeline overhead.
TARGETS = {
    "ceiling_ratio": 0.95,
    "efficiency": 0.85,
    "horovod_over_mwms": 1.3,
    "time_to_accuracy": 1.6,
    "not_training_share": 0.15,
}
# Keys of results written before the figures had their present names.
LEGACY_KEYS = {
    "ceiling_ratio": "2x1_over_1x2",
    "efficiency": "efficiency_2x1",
    "efficiency_pinned": "efficiency_2x1p",
    "2x1_vs_1x1": "horovod_2x1_vs_one_process",
    "2x1_vs_two_copies": "horovod_2x1_vs_two_copies",
    "two_copies_vs_1x1": "two_copies_vs_one_process",
}


def load(results: Path) -> dict[str, dict[str, Any]]:
    """Every ``<name>.json`` in `results`, by benchmark name."""
    return {p.stem: json.loads(p.read_text()) for p in sorted(results.glob("*.json"))}


def _get(d: dict[str, Any], key: str) -> Any:
    """``d[key]``, or its legacy name's value, or None."""
    value = d.get(key, d.get(LEGACY_KEYS.get(key, "")))
    return None if isinstance(value, float) and math.isnan(value) else value


def _measured(x: Any) -> bool:
    """A figure that was measured: not null (strict JSON) and not NaN (older files)."""
    return x is not None and x == x


def _verdict(ok: bool | None) -> str:
    return "n/a" if ok is None else ("met" if ok else "**missed**")


def _fmt(x: Any, digits: int = 2) -> str:
    if x is None:
        return "n/a"
    if isinstance(x, float):
        return "nan" if math.isnan(x) else f"{x:,.{digits}f}"
    return str(x)


def _capacity(r: dict[str, Any]) -> str:
    cap = r.get("machine_before", {}).get("cpu_capacity", {}).get("effective_cores_of_2")
    return f"{cap}" if cap is not None else "?"


def _model(r: dict[str, Any]) -> str:
    return str(r.get("settings", {}).get("model", "small CNN, before the model registry"))


def _target(what: str, key: str, value: float | None, detail: str) -> list[str]:
    """One row of the targets table: what, required, measured, verdict."""
    measured = "not measured" if value is None else f"{_fmt(value)} ({detail})"
    ok = None if value is None else value >= TARGETS[key]
    return [what, f"≥ {TARGETS[key]}", measured, _verdict(ok)]


def headline_targets(res: dict[str, dict[str, Any]]) -> list[list[str]]:
    """Issue 10's four targets, each with the value required and the value measured."""
    s, mw, t = res.get("scaling", {}), res.get("mwms", {}), res.get("time_to_accuracy", {})
    m, ratios = s.get("median_examples_per_second", {}), s.get("ratios", {})
    mm = mw.get("median_examples_per_second", {})
    w = t.get("median_wall_seconds_to_target", {})
    one = w.get("1x1", w.get("one_process"))
    target = t.get("settings", {}).get("target_test_accuracy", 0.97)
    return [
        _target(
            "Ceiling ratio T(2×1)/T(1×2): 2 ranks against 1 process on the same cores",
            "ceiling_ratio",
            _get(ratios, "ceiling_ratio"),
            f"{_fmt(m.get('2x1'), 0)} vs {_fmt(m.get('1x2'), 0)} ex/s, {_model(s)}",
        ),
        _target(
            "Efficiency T(2×1)/(2·T(1×1))",
            "efficiency",
            _get(ratios, "efficiency"),
            f"{_fmt(m.get('2x1'), 0)} vs {_fmt(m.get('1x1'), 0)} ex/s",
        ),
        _target(
            "Horovod / MultiWorkerMirroredStrategy throughput, 2×1",
            "horovod_over_mwms",
            _get(mw.get("ratios", {}), "horovod_over_mwms_throughput"),
            f"{_fmt(mm.get('horovod'), 0)} vs {_fmt(mm.get('mwms'), 0)} ex/s, {_model(mw)}",
        ),
        _target(
            f"Time to {target:.0%} test accuracy, 2×1 against 1×1 (speed-up, wall)",
            "time_to_accuracy",
            _get(t.get("speedup_wall", {}), "2x1_vs_1x1"),
            f"{_fmt(w.get('2x1', w.get('horovod_2x1')), 1)} vs {_fmt(one, 1)} s; against 1×2: "
            f"{_fmt(_get(t.get('speedup_wall', {}), '2x1_vs_1x2'))}×, {_model(t)}",
        ),
    ]


def scaling_rows(res: dict[str, dict[str, Any]]) -> list[list[str]]:
    """Detail rows of the scaling runs (``scaling`` and any ``scaling_*`` run apart)."""
    rows: list[list[str]] = []
    if s := res.get("scaling"):
        m, r = s["median_examples_per_second"], s["ratios"]
        if (effp := _get(r, "efficiency_pinned")) is not None:
            rows.append(
                [
                    "1. Efficiency, each process pinned to its own core (taskset-style)",
                    f"{_fmt(effp)} ({_fmt(m.get('2x1p'), 0)} vs {_fmt(m.get('1x1p'), 0)} ex/s)",
                    "(pinning)",
                    "",
                ]
            )
        if sec := s.get("secondary"):
            sr = sec["ratios"]
            rows.append(
                [
                    f"1. Secondary row, {sec['model']}: ceiling ratio and efficiency",
                    f"{_fmt(_get(sr, 'ceiling_ratio'))} and {_fmt(_get(sr, 'efficiency'))}",
                    "(the small model)",
                    "",
                ]
            )
    for name, r in res.items():
        if not name.startswith("scaling_") or "settings" not in r:
            continue
        m, batch = r["median_examples_per_second"], r["settings"]["batch_size_per_worker"]
        for key, value in r["ratios"].items():
            if key.startswith("efficiency"):
                rows.append(
                    [
                        f"1. {key} at per-worker batch {batch} (`{name}`, run apart)",
                        f"{_fmt(value)} ({', '.join(f'{k} {_fmt(v, 0)}' for k, v in m.items())})",
                        "(what the batch buys)",
                        "",
                    ]
                )
    return rows


def input_and_levers_rows(res: dict[str, dict[str, Any]]) -> list[list[str]]:
    """Detail rows: the former input pipeline comparison and the best lever."""
    rows: list[list[str]] = []
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
    if lv := res.get("levers"):
        best = max(lv["levers"].items(), key=lambda kv: kv[1]["over_baseline_2x1"], default=None)
        if best:
            name, row = best
            rows.append(
                [
                    "1. Fastest single lever on 2×1 (`levers`)",
                    f"{name}: {_fmt(row['over_baseline_2x1'])}× the plain 2×1"
                    + _lever_references(row),
                    "(adopt only if it keeps accuracy)",
                    "",
                ]
            )
    return rows


def _lever_references(row: dict[str, Any]) -> str:
    """ "; ceiling ratio x, efficiency y" where the lever run had its 1x1, 1x2 references."""
    if not _measured(row["ceiling_ratio"]):  # run with --no-references
        return " (run without its 1×1, 1×2 references)"
    return f"; ceiling ratio {_fmt(row['ceiling_ratio'])}, efficiency {_fmt(row['efficiency'])}"


def tta_rows(res: dict[str, dict[str, Any]]) -> list[list[str]]:
    """Detail rows of time to accuracy: speed-ups and the sampling comparison."""
    t = res.get("time_to_accuracy")
    if not t:
        return []
    w, tr = t["speedup_wall"], t["speedup_training"]
    rows = [
        [
            "2. Time to accuracy, 2×1 against 1×1 and against 1×2, training only (no start-up)",
            f"{_fmt(_get(tr, '2x1_vs_1x1'))}× and {_fmt(_get(tr, '2x1_vs_1x2'))}×",
            "(profile)",
            "",
        ]
    ]
    if _get(w, "two_copies_vs_1x1") is not None:
        rows.append(
            [
                "2. 2 independent copies (world size 1 each) against 1×1, wall",
                f"{_fmt(_get(w, 'two_copies_vs_1x1'))}× "
                f"(our 2×1 job against the copies: {_fmt(_get(w, '2x1_vs_two_copies'))}×)",
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
    return rows


def allreduce_rows(res: dict[str, dict[str, Any]]) -> list[list[str]]:
    """Detail rows of the allreduce benchmark."""
    a = res.get("allreduce")
    if not a:
        return []
    g = a["gradients"]
    rows = [
        [
            "4. Peak allreduce bus bandwidth / memcpy bandwidth",
            f"{_fmt(a['peak_busbw_over_memcpy'], 3)} "
            f"({_fmt(a['peak_busbw_gb_s'])} vs {_fmt(a['memcpy_gb_s'])} GB/s)",
            "(ceiling)",
            "",
        ]
    ]
    if tl := a.get("timeline"):
        rows.append(
            [
                f"4. Communication share of a 2×1 step ({g['bytes'] / 1e3:,.0f} KB grads, "
                f"{_model(a)})",
                f"allreduce {_fmt(a['step']['gradient_allreduce_share_of_step'])}; timeline: Gloo "
                f"{_fmt(tl['gloo_allreduce_share_of_step'])}, waiting "
                f"{_fmt(tl['negotiate_share_of_step'])} of a {_fmt(tl['step_ms'], 1)} ms step",
                "(profile)",
                "",
            ]
        )
    return rows


def pipeline_rows(res: dict[str, dict[str, Any]]) -> list[list[str]]:
    """Detail rows of data prep and the pipeline's overhead."""
    rows: list[list[str]] = []
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
    for name, m in res.get("pipeline_overhead", {}).get("medians", {}).items():
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


def target_rows(res: dict[str, dict[str, Any]]) -> list[list[str]]:
    """The detail table: one row per figure, beside the headline targets."""
    return (
        scaling_rows(res)
        + input_and_levers_rows(res)
        + tta_rows(res)
        + allreduce_rows(res)
        + pipeline_rows(res)
    )


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return lines


def summary_markdown(res: dict[str, dict[str, Any]]) -> str:
    """The Markdown summary: targets, the other figures, then one table per benchmark."""
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
        "## Targets",
        "",
    ]
    out += _table(["Target", "Required", "Measured", "Verdict"], headline_targets(res))
    out += ["", "## Other figures", ""]
    out += _table(["What", "Measured", "Target", "Verdict"], target_rows(res))
    out += [
        "",
        "Effective cores of 2 measured before each benchmark (2.0 = both free; a shared machine "
        "gives less; above 2 is noise of the 0.3 s probe): ",
    ]
    out += [", ".join(f"{name} {_capacity(r)}" for name, r in res.items()), ""]
    for section in (_scaling_section, _tta_section, _levers_section, _allreduce_section):
        out += section(res)
    out += _data_prep_section(res) + _pipeline_section(res) + _faults_section(res)
    return "\n".join(out) + "\n"


def _faults_section(res: dict[str, dict[str, Any]]) -> list[str]:
    f = res.get("faults")
    if not f:
        return []
    from bench.faults import fault_table

    settings = f["settings"]
    out = [
        f"## Faults ({settings['repeats']} trials each; {settings['model']}, "
        f"{settings['workers']} ranks, {settings['train_samples']:,} samples)",
        "",
    ]
    return out + fault_table(f) + [""]


def _scaling_section(res: dict[str, dict[str, Any]]) -> list[str]:
    s = res.get("scaling")
    if not s:
        return []
    rows = [
        [k, _fmt(v, 0), ", ".join(_fmt(x, 0) for x in _median_per_rank(s, k))]
        for k, v in s["median_examples_per_second"].items()
    ]
    if sec := s.get("secondary"):
        rows += [
            [f"{sec['model']}: {k}", _fmt(v, 0), ""]
            for k, v in sec["median_examples_per_second"].items()
        ]
    out = [f"## 1. Scaling (examples/s, median; {_model(s)})", ""]
    out += _table(["Layout (processes × threads)", "Examples/s", "Per rank"], rows)
    return out + ["", "![throughput against workers](scaling.png)", ""]


def _tta_section(res: dict[str, dict[str, Any]]) -> list[str]:
    t = res.get("time_to_accuracy")
    if not t:
        return []
    out = [f"## 2. Time to accuracy (seconds, median; {_model(t)})", ""]
    out += _table(
        ["Variant", "Wall, from launch", "Training only"],
        [
            [k, _fmt(v, 1), _fmt(t["median_training_seconds_to_target"][k], 1)]
            for k, v in t["median_wall_seconds_to_target"].items()
        ],
    )
    return out + [""]


def _levers_section(res: dict[str, dict[str, Any]]) -> list[str]:
    out: list[str] = []
    if lv := res.get("levers"):
        out += [f"## 1b. Levers on the 2×1 job (one at a time; {_model(lv)})", ""]
        rows = {"plain 2×1": lv["baseline"], **lv["levers"]}
        out += _table(
            ["Lever", "2×1 ex/s", "Over plain 2×1", "Ceiling ratio", "Efficiency", "References"],
            [
                [
                    name, _fmt(r["examples_per_second_2x1"], 0), _fmt(r["over_baseline_2x1"]),
                    _fmt(r["ceiling_ratio"]), _fmt(r["efficiency"]),
                    r["references"] if _measured(r["ceiling_ratio"]) else "not run",
                ]
                for name, r in rows.items()
            ],
        )  # fmt: skip
        out.append("")
    if acc := res.get("levers_accuracy"):
        out += [f"Test accuracy at {acc['settings']['epochs']} epochs, 2×1, per seed:", ""]
        out += _table(
            ["Variant", "Mean", "Per seed", "Difference of means", "Keeps accuracy"],
            [
                [
                    name, _fmt(r["mean"], 4), ", ".join(_fmt(x, 4) for x in r["test_accuracy"]),
                    _fmt(r.get("difference_of_means", 0.0), 4), str(r.get("keeps_accuracy", "")),
                ]
                for name, r in acc["accuracy"].items()
            ],
        )  # fmt: skip
        out.append("")
    return out + _profile_lines(res)


def _profile_lines(res: dict[str, dict[str, Any]]) -> list[str]:
    pr = res.get("levers_profile")
    if not pr:
        return []
    b = pr["profile"]["breakdown"]
    out = [
        f"Where a 2×1 step goes (`levers_profile`, lever {pr['lever']}): a "
        f"{_fmt(b['step_ms'], 1)} ms step on rank 0 is {_fmt(b['outside_horovod_share'])} "
        f"outside Horovod, {_fmt(b['negotiate_allreduce_share'])} waiting for the other rank "
        f"(negotiation), {_fmt(b['allreduce_share'])} in the allreduce. CPU ms per step by "
        "thread origin:",
        "",
    ]
    out += _table(
        ["Rank", "Cores busy", "CPU ms per step by origin"],
        [
            [name, _fmt(t["cores_busy"]), ", ".join(
                f"{k} {_fmt(v, 1)}" for k, v in t["cpu_ms_per_step_by_origin"].items())]
            for name, t in pr["profile"]["threads"].items()
        ],
    )  # fmt: skip
    return out + [""]


def _allreduce_section(res: dict[str, dict[str, Any]]) -> list[str]:
    a = res.get("allreduce")
    if not a:
        return []
    out = ["## 4. Allreduce (Gloo, 2 ranks, loopback)", ""]
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
    return out + ["", f"memcpy: {_fmt(a['memcpy_gb_s'])} GB/s", ""]


def _data_prep_section(res: dict[str, dict[str, Any]]) -> list[str]:
    d = res.get("data_prep")
    if not d:
        return []
    out = ["## 5. Data prep", ""]
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
    return out + [""]


def _pipeline_section(res: dict[str, dict[str, Any]]) -> list[str]:
    p = res.get("pipeline_overhead")
    if not p:
        return []
    out = ["## 6. `make run` wall time by step (seconds, median)", ""]
    for name, m in p["medians"].items():
        rows = [[k, _fmt(v, 2), _fmt(m["task_share"][k])] for k, v in m["task_seconds"].items()]
        rows.append(
            ["orchestration", _fmt(m["orchestration_seconds"], 2), _fmt(m["orchestration_share"])]
        )
        rows.append(["training proper (inside train)", _fmt(m["training_seconds"], 2), ""])
        out += [f"**{name}** (total {_fmt(m['total_seconds'], 1)} s)", ""]
        out += _table(["Step", "Seconds", "Share"], rows)
        out.append("")
    return out


def _median_per_rank(s: dict[str, Any], layout: str) -> list[float]:
    import statistics

    runs = s["runs"][layout]
    ranks = len(runs[0]["per_rank_examples_per_second"])
    return [
        statistics.median(r["per_rank_examples_per_second"][i] for r in runs) for i in range(ranks)
    ]


def _size(n: int) -> str:
    return f"{n // 2**20} MB" if n >= 2**20 else f"{n // 1024} KB"


def write_report(results: Path) -> list[Path]:
    """Write ``summary.md`` and, if scaling ran, ``scaling.png`` into `results`."""
    res = load(results)
    written = [results / "summary.md"]
    written[0].write_text(summary_markdown(res))
    if "scaling" in res:
        written.append(scaling_plot(res["scaling"], results / "scaling.png"))
    if "time_to_accuracy" in res:
        tta = res["time_to_accuracy"]
        written.append(time_to_accuracy_plot(tta, results / "time_to_accuracy.png"))
    return written
