"""The benchmarks' pictures: throughput against processes, test accuracy against training time."""

from __future__ import annotations

from pathlib import Path
from typing import Any

COLOURS = {"1x1": "tab:blue", "1x2": "tab:orange", "2x1": "tab:green"}


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def scaling_plot(scaling: dict[str, Any], path: Path) -> Path:
    """Throughput against processes (1 thread each), the ideal line, and 1 x T points."""
    from bench.scaling import parse_layout

    plt = _pyplot()
    medians: dict[str, float] = scaling["median_examples_per_second"]
    layouts = {k: parse_layout(k) for k in medians}
    points = sorted((w, medians[k]) for k, (w, t) in layouts.items() if t == 1)
    fig, ax = plt.subplots(figsize=(6, 4), dpi=100)
    if points:
        xs, ys = zip(*points, strict=True)
        ax.plot(xs, ys, "o-", label="Horovod, N processes × 1 thread")
        base = dict(points).get(1)
        if base and len(xs) > 1:
            ax.plot(xs, [base * x for x in xs], ":", color="grey", label="ideal")
    for k, (workers, threads) in layouts.items():
        if workers == 1 and threads > 1:
            ax.plot([threads], [medians[k]], "s", label=f"1 process × {threads} threads")
    top = max([w for w, _ in layouts.values()] + [t for _, t in layouts.values()])
    ax.set_xticks(range(1, top + 1))  # whole processes (or threads)
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


def time_to_accuracy_plot(result: dict[str, Any], path: Path) -> Path:
    """Test accuracy against training time for 1x1, 1x2 and 2x1, one line per seed, with the
    targets marked."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=100)
    for name, colour in COLOURS.items():
        for i, run in enumerate(result["runs"].get(name, [])):
            xs = [p["training_seconds"] for p in run["curve"]]
            ys = [p["accuracy"] for p in run["curve"]]
            label = f"{name} (seeds {', '.join(str(r['seed']) for r in result['runs'][name])})"
            ax.plot(xs, ys, "-", color=colour, alpha=0.8, label=label if i == 0 else None)
    at = set(result.get("plateau", {}).get("targets_at_plateau", []))
    for target in result["settings"]["targets"]:
        style = ":" if target in at else "--"
        note = " (at the plateau)" if target in at else ""
        ax.axhline(target, linestyle=style, color="grey", linewidth=0.8)
        ax.annotate(f"{target:.0%}{note}", (0.01, target), xycoords=("axes fraction", "data"),
                    fontsize=8, va="bottom")  # fmt: skip
    ax.set_ylim(0.9, 1.0)
    ax.set_xlabel("training time from the first step (s)")
    ax.set_ylabel("test accuracy (1,000 held-out digits)")
    ax.set_title("Time to accuracy")
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path
