"""``python -m bench.report``: bench/results/*.json -> ``docs/performance.md``, ``summary.md``
and the plots. Every figure on the page comes from a result file, so none can go stale (a test
regenerates the page and compares).
"""

from __future__ import annotations

import json
import math
import sys
from collections import Counter
from pathlib import Path
from typing import Any

from bench.common import RESULTS_DIR
from bench.plots import scaling_plot, time_to_accuracy_plot

DOC = Path(__file__).resolve().parents[1] / "docs" / "performance.md"
# bench.stack's comparisons of two environments are not part of `make bench`: their own page,
# beside the performance page (and beside summary.md in the results).
STACKS_PAGE = "stacks.md"
# The targets (2 cores, the default model). Efficiency is measured against the machine's own
# ceiling: two independent 1x1 jobs at once measured 0.88 of twice one alone here, so 0.93 of
# twice 1x1 was above what this machine can give two processes.
TARGETS = {
    "efficiency_vs_machine": ("efficiency T(2x1) / T(two 1x1 jobs at once)", 0.97),
    "ceiling_ratio": ("ceiling ratio T(2x1) / T(1x2)", 0.95),
    "horovod_over_mwms": ("Horovod / MultiWorkerMirroredStrategy, 2x1, batch 64", 1.2),
    "time_to_96": ("time to 96%, 2x1 against 1x1, training time, median of 3 seeds", 1.6),
    "estimate_over_measured": ("the `paid:` estimate over the measured efficiency, 2x1", 1.0),
    "not_training_seconds": ("`make run`'s seconds outside training (median)", 10.0),
    "stream_over_memory": (
        "streamed TFRecord input / in-memory input, 2x1 throughput, median of the rounds",
        0.97,
    ),
    "input_over_decode": ("one rank's input / decoding the JPEGs alone, one core", 0.9),
    "memory_growth": ("a rank's peak memory, 80,000 images / 10,000", 1.1),
    "decoded_over_peak": ("80,000 images' decoded size / a rank's peak memory", 1.0),
    "prep_speedup": ("data prep's images/s, 2 ParallelFor tasks / 1, slices' phase", 1.7),
}
# The targets met from below, and those met within a margin either side (the rest from above).
AT_MOST = {"not_training_seconds", "memory_growth"}
WITHIN = {"estimate_over_measured": 0.05}


MWMS_ON_KERAS_3 = (
    "The trainer runs Keras 3, where MultiWorkerMirroredStrategy's `fit` fails (keras#20585): "
    "`bench.mwms` refuses to run there, and these figures are from the tf-keras stack it last "
    "ran on (the header names its TF)."
)


def load(results: Path) -> dict[str, dict[str, Any]]:
    """Every ``<name>.json`` in `results`, by benchmark name."""
    return {p.stem: json.loads(p.read_text()) for p in sorted(results.glob("*.json"))}


def fmt(x: Any, digits: int = 2) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "n/a"
    return f"{x:,.{digits}f}" if isinstance(x, float) else str(x)


def table(header: list[str], rows: list[list[Any]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(fmt(c) if not isinstance(c, str) else c for c in row) + " |"
                    for row in rows]  # fmt: skip


def measured(res: dict[str, dict[str, Any]]) -> dict[str, float | None]:
    """The targets' figures, each from the benchmark that measures it."""
    levers = res.get("levers", {}).get("levers", {}).get("baseline", {})
    tta = res.get("time_to_accuracy", {}).get("speedups", {}).get("0.96", {})
    mwms = res.get("mwms", {}).get("ratios", {})
    ceiling = res.get("scaling", {}).get("machine_ceiling", {})
    estimate = res.get("scaling", {}).get("estimate", {})
    pipeline = res.get("pipeline_overhead", {}).get("medians", {}).get("default", {})
    own = res.get("input_pipeline", {})
    return {
        "stream_over_memory": own.get("streaming", {}).get("stream_over_memory"),
        "input_over_decode": own.get("input", {}).get("rank_input_over_decode"),
        "memory_growth": own.get("memory", {}).get("peak_growth"),
        "decoded_over_peak": own.get("memory", {}).get("largest_decoded_over_peak"),
        "prep_speedup": own.get("prep", {}).get("speedup"),
        "efficiency_vs_machine": ceiling.get("efficiency_vs_machine"),
        "ceiling_ratio": levers.get("ceiling_ratio"),
        "horovod_over_mwms": mwms.get("horovod_over_mwms_throughput"),
        "time_to_96": tta.get("2x1_vs_1x1_training"),
        "estimate_over_measured": estimate.get("estimate_over_measured"),
        "not_training_seconds": pipeline.get("not_training_seconds"),
    }


def target_bound(key: str, required: float, value: float | None) -> tuple[str, bool]:
    """The target's bound as the page writes it, and whether `value` meets it."""
    if key in WITHIN:
        margin = WITHIN[key]
        return f"{required} ± {margin}", value is not None and abs(value - required) <= margin
    if key in AT_MOST:
        return f"≤ {required}", value is not None and value <= required
    return f"≥ {required}", value is not None and value >= required


def targets_section(res: dict[str, dict[str, Any]]) -> list[str]:
    values = measured(res)
    rows = []
    for key, (what, required) in TARGETS.items():
        value = values[key]
        bound, met = target_bound(key, required, value)
        verdict = "n/a" if value is None else ("met" if met else "**missed**")
        rows.append([what, bound, fmt(value), verdict])
    return ["## Targets", "", *table(["Target", "Required", "Measured", "Verdict"], rows), ""]


def levers_section(res: dict[str, dict[str, Any]]) -> list[str]:
    lv = res.get("levers")
    if not lv:
        return []
    s = lv["settings"]
    rows = [[name, row["what"], row["examples_per_second"], row["over_baseline"],
             row["efficiency"], row.get("estimated_efficiency")]
            for name, row in lv["levers"].items()]  # fmt: skip
    m = lv["median_examples_per_second"]
    return [
        "## The launcher and Horovod's settings (`bench.levers`)", "",
        f"{s['model']}, batch {s['batch_size_per_worker']} per rank, 1 thread per rank, "
        f"{s['train_samples']:,} samples, {s['epochs']} epochs (the first not timed), "
        f"{s['repeats']} interleaved rounds; medians. References: 1x1 {fmt(m['1x1'], 0)}, 1x2 "
        f"{fmt(m['1x2'], 0)} examples/s. Over default: against the default of the same rank "
        "count. Estimated: the run summary's own estimate (compute's share of a step).", "",
        *table(["lever", "what", "examples/s", "over default", "efficiency", "estimated"], rows),
        "",
    ]  # fmt: skip


def tta_section(res: dict[str, dict[str, Any]]) -> list[str]:
    tta = res.get("time_to_accuracy")
    if not tta:
        return []
    s, plateau = tta["settings"], tta.get("plateau", {})
    rows = []
    for name, by_target in tta["times"].items():
        for target, t in by_target.items():
            rows.append(
                [
                    name,
                    target,
                    f"{t['reached']}/{t['of']}",
                    _median_range(t, "training_seconds"),
                    _median_range(t, "wall_seconds"),
                ]
            )
    lines = [
        "## Time to accuracy (`bench.time_to_accuracy`)", "",
        f"{s['model']}, {s['train_samples']:,} samples, {s['epochs']} epochs, seeds "
        f"{s['seeds']}, test accuracy of {s['snapshots_per_epoch']} snapshots an epoch on "
        f"{s['test_digits']:,} held-out digits, scored after the job. The 1x1 runs end at "
        f"{fmt(plateau.get('final_accuracy_1x1'), 4)} (standard error "
        f"{fmt(plateau.get('standard_error'), 4)}): targets at the plateau, decided by luck: "
        f"{plateau.get('targets_at_plateau')}.", "",
        "![test accuracy against training time](../bench/results/time_to_accuracy.png)", "",
        *table(["variant", "target", "reached", "training s: median (range)",
                "wall s: median (range)"], rows), "",
    ]  # fmt: skip
    return lines + _rules_lines(tta)


def _median_range(t: dict[str, Any], clock: str) -> str:
    if f"median_{clock}" not in t:
        return "not reached by every seed"
    low, high = t[f"range_{clock}"]
    return f"{t[f'median_{clock}']} ({low}–{high})"


def _rules_lines(tta: dict[str, Any]) -> list[str]:
    rules = tta.get("rules", {})
    rows = [[rule, r["median_training_seconds_to_96"], r["final_accuracy_mean"],
             "yes" if r["keeps_accuracy"] else "no"] for rule, r in rules.items()]  # fmt: skip
    return [
        "Learning-rate rules at 2x1 (`lr_scaling`; adadelta is the seed example's, a reference):",
        "", *table(["rule", "median training s to 96%", "final accuracy (mean)",
                    "keeps accuracy"], rows), "",
        f"The fastest rule that keeps accuracy: **{tta.get('adopt')}**.", "",
    ]  # fmt: skip


def other_sections(res: dict[str, dict[str, Any]]) -> list[str]:
    lines: list[str] = []
    if "scaling" in res:
        sc = res["scaling"]
        lines += ["## Scaling (`bench.scaling`)", "", "![throughput](../bench/results/scaling.png)",
                  "", *table(["layout", "examples/s"], [[k, v] for k, v in
                  sc["median_examples_per_second"].items()]), "",
                  f"Ratios: {sc['ratios']}; estimate: {sc.get('estimate')}; the machine's "
                  f"ceiling: {sc.get('machine_ceiling')}.", ""]  # fmt: skip
    if "mwms" in res:
        mw = res["mwms"]
        lines += ["## Horovod against MultiWorkerMirroredStrategy (`bench.mwms`)", "",
                  *table(["", "examples/s"], [[k, v] for k, v in
                  mw["median_examples_per_second"].items()]), "", f"Ratios: {mw['ratios']}.",
                  "", MWMS_ON_KERAS_3, ""]  # fmt: skip
    if "pipeline_overhead" in res:
        for name, m in res["pipeline_overhead"]["medians"].items():
            lines += [f"## `make run`'s time (`bench.pipeline_overhead`, {name})", "",
                      f"Total {fmt(m.get('total_seconds'), 1)} s, training "
                      f"{fmt(m.get('training_seconds'), 1)} s, not training "
                      f"{fmt(m.get('not_training_share'))} of it; per task: "
                      f"{m.get('task_seconds')}.", ""]  # fmt: skip
    return lines


def stack_section(res: dict[str, dict[str, Any]]) -> list[str]:
    """Every ``stack*`` result (bench.stack's ``--result``): two stacks side by side."""
    return [line for name in sorted(res) if name.startswith("stack")
            for line in _stack(name, res[name])]  # fmt: skip


def _stack(name: str, st: dict[str, Any]) -> list[str]:
    names = st["this_and_other"]
    vers = "; ".join(
        f"{n}: TF {v['tensorflow']}, Keras {v.get('keras') or '?'}"
        + (f", tf-keras {v['tf-keras']}" if v.get("tf-keras") else "")
        + f", Horovod {v['horovod']}, Python {v['python']}"
        for n, v in st["stacks"].items()
    )
    rows = [[lay, *(st["median_examples_per_second"][n][lay] for n in names),
             st["this_over_other"][lay]] for lay in st["this_over_other"]]  # fmt: skip
    accuracy = st.get("accuracy_by_round")
    by_round = {lay: _round_ratios(st, names, lay) for lay in st["this_over_other"]}
    own = st.get("other_trainer") == "its own checkout's"
    trainer = "Each stack's own trainer (its checkout's)" if own else "The same trainer code"
    return [
        f"## Two stacks side by side (`bench.stack`, `{name}`)", "",
        f"{vers}. {trainer}, default model, batch "
        f"{st['settings']['batch_size_per_worker']} per rank, {st['settings']['repeats']} "
        "interleaved rounds; medians, examples/s.", "",
        *table(["layout", *names, f"{names[0]} / {names[1]}"], rows), "",
        f"{names[0]} / {names[1]} round by round: {by_round}.", "",
        f"Per stack: {st['figures']}.", "",
        *([f"Last epoch's training accuracy by round (seed = round): {accuracy}.", ""]
          if accuracy else []),
    ]  # fmt: skip


def _round_ratios(st: dict[str, Any], names: list[str], layout: str) -> list[float]:
    """This stack's throughput over the other's in each round of `layout`."""
    this, other = (st["runs"][f"{n}/{layout}"] for n in names)
    return [round(a["examples_per_second"] / b["examples_per_second"], 3)
            for a, b in zip(this, other, strict=True)]  # fmt: skip


def machines_line(res: dict[str, dict[str, Any]]) -> str:
    """The machine most results were measured on, and each result measured elsewhere."""
    keys = ("cpu_model", "cores", "tensorflow", "keras", "horovod")
    machines = {n: tuple(r.get("hardware", {}).get(k, "?") for k in keys) for n, r in res.items()}
    said = {m: "{}, {} cores, TF {}, Keras {}, Horovod {}".format(*m) for m in machines.values()}
    common = Counter(machines.values()).most_common(1)[0][0] if machines else ("?",) * 5
    others = [f"`{n}` on {said[m]}" for n, m in sorted(machines.items()) if m != common]
    return f"Measured on {said.get(common, '?')}" + (f" ({'; '.join(others)})" if others else "")


def run_line(res: dict[str, dict[str, Any]]) -> str:
    """Which full `make bench` run the page comes from (bench/results/make_bench.json)."""
    run = res.get("make_bench")
    if not run:
        return "No full `make bench` run recorded (make_bench.json): results of separate runs."
    minutes = run["total_seconds"] / 60
    return (f"From one `make bench`, started {run['started']}, which took {minutes:.0f} min "
            f"(per benchmark, s: {run['seconds']}).")  # fmt: skip


def performance_markdown(res: dict[str, dict[str, Any]]) -> str:
    res = {n: r for n, r in res.items() if not n.startswith("stack")}
    head = [
        "# Performance", "",
        "Generated by `python -m bench.report` from `bench/results/*.json`; do not edit. "
        f"{run_line(res)} {machines_line(res)}. Absolute "
        "rates drift 20–50% between machines and sessions: the ratios, measured side by side in "
        "one run, are the result. How each figure is made: [bench/README.md](../bench/README.md).",
        "",
    ]  # fmt: skip
    body = targets_section(res) + levers_section(res) + tta_section(res) + other_sections(res)
    return "\n".join(head + body + input_section(res))


def input_section(res: dict[str, dict[str, Any]]) -> list[str]:
    """`bench.input_pipeline`: the input on a user's own images."""
    own = res.get("input_pipeline")
    if not own:
        return []
    lines = ["## The input on your own images (`bench.input_pipeline`)", ""]
    if st := own.get("streaming"):
        rounds = ", ".join(fmt(r, 3) for r in st["ratio_per_round"])
        lines += [
            f"Streamed TFRecords against the same trainer fed from memory, 2x1, "
            f"{st['train_samples']:,} digits, {st['epochs']} epochs: "
            f"**{fmt(st['stream_over_memory'], 3)}** (rounds: {rounds}).",
            "",
        ]
    if ip := own.get("input"):
        size = ip["bytes_per_image"]
        rows = [
            ["JPEG decoding alone", ip["decode_alone_per_second"], "", size["jpeg_files"]],
            [
                "the rank's input (records of decoded pixels: what data prep writes)",
                ip["rank_input_per_second"],
                ip["rank_input_over_decode"],
                size["prepared_decoded"],
            ],
            [
                "records of the JPEGs' bytes, decoded in the input (not chosen)",
                ip["encoded_input_per_second"],
                ip["encoded_input_over_decode"],
                size["encoded_records"],
            ],
        ]
        lines += [
            f"{ip['images']:,} generated 64x64 colour JPEGs, one core (best of 3):",
            "",
            *table(["", "images/s", "/ decoding", "bytes an image"], rows),
            "",
        ]
    if mem := own.get("memory"):
        rows = [
            [f"{int(n):,}", by["decoded_mb"], ", ".join(fmt(v, 1) for v in by["peak_rss_mb"])]
            for n, by in mem["by_size"].items()
        ]
        lines += [
            f"Each rank's peak memory in a real 2x1 job of one epoch, "
            f"{mem['images_side']}x{mem['images_side']} colour images:",
            "",
            *table(["images", "decoded MB", "peak MB of ranks 0, 1"], rows),
            "",
        ]
    if pr := own.get("prep"):
        rounds = ", ".join(fmt(r, 2) for r in pr["speedup_per_round"])
        lines += [
            f"Data prep's graph in kfp.local, {pr['images']:,} generated 64x64 JPEGs: 2 slices "
            f"against 1, **{fmt(pr['speedup'])}x** the images/s of the slices' phase (rounds: "
            f"{rounds}); {fmt(pr['speedup_whole'])}x for the whole graph (listing and "
            "publishing included).",
            "",
        ]
    return lines


def stacks_markdown(res: dict[str, dict[str, Any]]) -> str:
    head = [
        "# Two stacks side by side", "",
        "Generated by `python -m bench.report` from `bench/results/stack*.json`; do not edit. "
        "`bench.stack` is not part of `make bench`: each comparison is its own run "
        "(bench/README.md).", "",
    ]  # fmt: skip
    return "\n".join(head + stack_section(res))


def write_report(results: Path = RESULTS_DIR, doc: Path | None = None) -> list[Path]:
    """Write ``summary.md``, ``stacks.md`` and the plots into `results` (and the pages `doc`
    and its sibling ``stacks.md``, if given)."""
    res = load(results)
    text = performance_markdown(res)
    written = [results / "summary.md"]
    written[0].write_text(text)
    if any(n.startswith("stack") for n in res):
        stacks = stacks_markdown(res)
        for path in [results / STACKS_PAGE] + ([doc.with_name(STACKS_PAGE)] if doc else []):
            path.write_text(stacks)
            written.append(path)
    if "scaling" in res:
        written.append(scaling_plot(res["scaling"], results / "scaling.png"))
    if "time_to_accuracy" in res:
        tta = res["time_to_accuracy"]
        written.append(time_to_accuracy_plot(tta, results / "time_to_accuracy.png"))
    if doc is not None:
        doc.write_text(text)
        written.append(doc)
    return written


def main(argv: list[str] | None = None) -> int:
    """CLI: ``python -m bench.report`` (writes docs/performance.md too)."""
    for path in write_report(RESULTS_DIR, DOC):
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
