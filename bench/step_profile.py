"""Where a 2x1 step's time goes: the Horovod timeline and every thread's CPU, per step.

One 2x1 training run under ``bench.rank_profile`` (each rank's threads' CPU time over the
timed epochs) with ``HOROVOD_TIMELINE`` (rank 0's view of every collective), both cut to the
same window (second epoch to the end of training) and divided by its steps:

- ``timeline_ms_per_step``: for each timeline activity, the time per step during which at
  least one tensor was in it (the union of the tensors' intervals, so fused tensors count
  once). ``NEGOTIATE_ALLREDUCE`` is the wait from the first rank's "ready" to the last
  one's (ranks out of phase, plus up to one HOROVOD_CYCLE_TIME); ``ALLREDUCE`` the reduction
  itself (``MEMCPY_IN_FUSION_BUFFER``, ``GLOO_ALLREDUCE``, ``MEMCPY_OUT_FUSION_BUFFER``).
- ``breakdown``: rank 0's step split into outside Horovod (forward, backward, optimizer,
  input, Keras), negotiating and allreducing.
- ``threads``: per rank, CPU milliseconds per step of each thread with its origin (see
  ``bench.rank_profile``), the sum per origin, and the cores the rank kept busy.

By hand, ``top -H -b -d 1 -n 5 -p <rank pids>`` shows the same threads (all named
``python``; ``bench.rank_profile`` tells them apart by when they started).
"""

from __future__ import annotations

import collections
import json
from pathlib import Path
from typing import Any

Interval = tuple[float, float]


def timeline_events(path: Path) -> tuple[float, list[dict[str, Any]]]:
    """The timeline's start (unix microseconds) and its events (the file may lack its ``]``)."""
    raw = path.read_text().rstrip().rstrip(",")
    events = json.loads(raw if raw.endswith("]") else raw + "]")
    start = next(
        (
            float(e["args"]["start_time_since_epoch_in_micros"])
            for e in events
            if "start_time_since_epoch_in_micros" in e.get("args", {})
        ),
        0.0,
    )
    return start, events


def activity_intervals(events: list[dict[str, Any]]) -> dict[str, list[Interval]]:
    """Each activity's (begin, end) intervals in timeline microseconds, over all tensors."""
    open_: dict[Any, list[tuple[str, float]]] = collections.defaultdict(list)
    spans: dict[str, list[Interval]] = collections.defaultdict(list)
    for e in events:
        if e.get("ph") == "B":
            open_[e.get("pid")].append((e["name"], float(e["ts"])))
        elif e.get("ph") == "E" and open_[e.get("pid")]:
            name, t0 = open_[e.get("pid")].pop()
            spans[name].append((t0, float(e["ts"])))
    return spans


def union_length(intervals: list[Interval], lo: float, hi: float) -> float:
    """The length of the union of `intervals`, clipped to ``[lo, hi]``."""
    total, reach = 0.0, lo
    for start, end in sorted(intervals):
        start, end = max(start, reach), min(end, hi)
        if end > start:
            total += end - start
            reach = end
    return total


def timeline_per_step(path: Path, window: dict[str, Any]) -> dict[str, float]:
    """Milliseconds per step that each activity was under way, within the rank's window."""
    start_us, events = timeline_events(path)
    lo = window["start_unix"] * 1e6 - start_us
    hi = window["end_unix"] * 1e6 - start_us
    steps = max(1, window["steps"])
    spans = activity_intervals(events)
    out = {name: union_length(iv, lo, hi) / 1000 / steps for name, iv in sorted(spans.items())}
    out["horovod_any"] = (
        union_length([i for name in spans for i in spans[name]], lo, hi) / 1000 / steps
    )
    return {k: round(v, 3) for k, v in out.items()}


def thread_table(rank: dict[str, Any]) -> dict[str, Any]:
    """One rank's threads: CPU ms per step each (busiest first), per origin, cores busy."""
    window = rank["window"]
    steps, seconds = max(1, window["steps"]), max(1e-9, window["seconds"])
    rows = [
        {
            "tid": t["tid"],
            "origin": t["origin"],
            "cpu_ms_per_step": round((t["user_seconds"] + t["system_seconds"]) * 1000 / steps, 3),
            "system_share": round(
                t["system_seconds"] / max(1e-9, t["user_seconds"] + t["system_seconds"]), 2
            ),
        }
        for t in rank["threads"]
    ]
    rows = sorted(
        (r for r in rows if r["cpu_ms_per_step"] > 0), key=lambda r: -r["cpu_ms_per_step"]
    )
    by_origin: dict[str, float] = collections.defaultdict(float)
    for r in rows:
        by_origin[r["origin"]] += r["cpu_ms_per_step"]
    total_cpu = sum(by_origin.values()) * steps / 1000
    return {
        "step_ms": round(seconds * 1000 / steps, 3),
        "cores_busy": round(total_cpu / seconds, 2),
        "cpu_ms_per_step_by_origin": {k: round(v, 3) for k, v in sorted(by_origin.items())},
        "threads": rows,
    }


def breakdown(step_ms: float, timeline: dict[str, float]) -> dict[str, float]:
    """Rank 0's step: outside Horovod, negotiating, allreducing (ms and share of the step)."""
    negotiate = timeline.get("NEGOTIATE_ALLREDUCE", 0.0)
    allreduce = timeline.get("ALLREDUCE", 0.0)
    outside = max(0.0, step_ms - timeline.get("horovod_any", negotiate + allreduce))
    parts = {"outside_horovod": outside, "negotiate_allreduce": negotiate, "allreduce": allreduce}
    out = {f"{k}_ms": round(v, 3) for k, v in parts.items()}
    out.update({f"{k}_share": round(v / step_ms, 3) if step_ms else 0.0 for k, v in parts.items()})
    out["step_ms"] = round(step_ms, 3)
    return out


def analyse(timeline: Path, threads_dir: Path) -> dict[str, Any]:
    """The profile of one run from its timeline and its ranks' thread records."""
    ranks = [json.loads(p.read_text()) for p in sorted(threads_dir.glob("rank-*.json"))]
    if not ranks:
        raise RuntimeError(f"no rank-*.json in {threads_dir}: did bench.rank_profile run?")
    rank0 = next((r for r in ranks if r["rank"] == 0), ranks[0])
    per_step = timeline_per_step(timeline, rank0["window"])
    tables = {f"rank{r['rank']}": thread_table(r) for r in ranks}
    return {
        "window": rank0["window"],
        "timeline_ms_per_step": per_step,
        "breakdown": breakdown(tables[f"rank{rank0['rank']}"]["step_ms"], per_step),
        "threads": tables,
    }
