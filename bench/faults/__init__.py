"""``python -m bench.faults``: does a run survive each fault, and what does the fault cost?

Each fault in `RUNNERS` runs `--repeats` times (N, 3 by default) against the real parts: the
trainer under real ``horovodrun --gloo`` through the local launcher (`launch.run_local`), the
real google-cloud-storage client against fake-gcs-server (`standins.fake_gcs`), and the MPIJob
backend (`run_mpijob`) with the real kubernetes client against kmock (`standins.kmock_cluster`,
where the MPIJob's launcher is the stored manifest's trainer command run by horovodrun on this
machine; what kmock cannot do, that module plays and says so). Every trial is one record:

- ``survived``: the fault's own checks passed (below) and the run ended with one model;
- ``epochs_lost``: training done before the fault that had to be done again (fractional: the
  part of an epoch since its last checkpoint, from the checkpoint lines' times);
- ``time_to_recover_s``: from the fault to the point the run is back (per fault, below);
- ``models_exported``: ``saved_model.pb`` files under the run's output (must be 1);
- ``half_written``: files left partial under the output, checkpoint, dataset and registry
  locations (temporary or staging names, an epoch directory without its ``checkpoint.json``, a
  model without ``saved_model.pb``, a dataset without ``manifest.json``); must be 0.

The faults (time to recover in brackets):

- ``static_sigkill``: rank 1 SIGKILLed half an epoch after the 2nd checkpoint; the job fails, a
  rerun resumes from the last checkpoint (kill to the rerun's resume line).
- ``sigstop``: rank 1 SIGSTOPped likewise; the launcher names it and ends the job once it has
  been stopped for the stall bound (`components.train.rankwatch`; short stall settings through
  the job's environment), then a rerun resumes (stop to the rerun's resume line).
- ``checkpoint_truncated``, ``checkpoint_deleted``, ``latest_json_corrupt``: the checkpoints of
  a finished 2-epoch run, damaged, resumed by a 3-epoch run: it falls back to epoch 1 (epoch 2
  for a corrupt ``latest.json``), saying so once (launch to the resume line).
- ``gcs_transient``: 503 and 429 on a share of requests (`standins.fake_gcs.FaultProxy`) during
  data prep, training (its checkpoints, summary and model), evaluation and registration; each
  retry must be logged once: logged retries = injected faults (the longest single recovery).
- ``kfp_retry``: the train task's pod is lost after the first epoch and KFP retries it: the
  retry reattaches to the same MPIJob, which trained on meanwhile (loss to the reattach line).
- ``cancel``: SIGTERM to the train task mid-training: the MPIJob is deleted and its pods and
  ranks are gone (SIGTERM to all gone); then the run is retried and resumes.

``elastic_sigkill`` kills a rank of an elastic job (3 workers, ``min_workers`` 2): the other two
go on as one job at once, the interrupted epoch runs again at the new size, and the one model
is exported at the end. Its time to recover runs from the kill to the launcher's first line
of the new world; its epochs lost are the part of the interrupted epoch done before the kill.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.common import base_parser, fresh, machine_state, median, scratch, write_result
from bench.faults.cluster import cancel, gcs_transient, kfp_retry
from bench.faults.local import (
    checkpoint_deleted,
    checkpoint_truncated,
    elastic_sigkill,
    latest_json_corrupt,
    sigstop,
    static_sigkill,
)
from bench.faults.runs import GCS_SHARE, STALL_ENV, TRAIN_LIMIT, Bench, progress_at, record
from components.common.defaults import BATCH_SIZE_PER_WORKER

__all__ = ["RUNNERS", "LABELS", "progress_at", "record", "summarise", "fault_table", "main"]
NAME = "faults"


# --- the registry, the summary and the table ----------------------------------------------------

Runner = Callable[[Bench], dict[str, Any]]
# One runner per fault, in the table's order.
RUNNERS: dict[str, Runner] = {
    "static_sigkill": static_sigkill,
    "elastic_sigkill": elastic_sigkill,
    "sigstop": sigstop,
    "gcs_transient": gcs_transient,
    "checkpoint_truncated": checkpoint_truncated,
    "checkpoint_deleted": checkpoint_deleted,
    "latest_json_corrupt": latest_json_corrupt,
    "kfp_retry": kfp_retry,
    "cancel": cancel,
}
LABELS = {
    "static_sigkill": ("rank SIGKILLed mid-epoch (static job)", "job fails; rerun resumes"),
    "elastic_sigkill": ("rank SIGKILLed mid-epoch (elastic job, 3 workers, min 2)",
                        "the other 2 go on; the interrupted epoch runs again"),
    "sigstop": ("rank hangs (SIGSTOP)", "launcher names it, ends the job at the stall bound; "
                "rerun resumes"),
    "gcs_transient": ("GCS 503/429 on 10% of requests", "each call retried (logged once)"),
    "checkpoint_truncated": ("latest checkpoint truncated", "resume from the one before"),
    "checkpoint_deleted": ("latest checkpoint's data deleted", "resume from the one before"),
    "latest_json_corrupt": ("`latest.json` corrupt", "resume from the newest intact epoch"),
    "kfp_retry": ("KFP retry of the train task", "reattaches to the same MPIJob"),
    "cancel": ("cancel (SIGTERM to the task)", "MPIJob deleted, pods and ranks gone; retry "
               "resumes"),
}  # fmt: skip


def summarise(records: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per fault: trials, survived, medians of epochs lost and time to recover, every count."""
    out: dict[str, dict[str, Any]] = {}
    for fault in dict.fromkeys(r["fault"] for r in records):
        rows = [r for r in records if r["fault"] == fault]
        out[fault] = {
            "trials": len(rows),
            "survived": sum(r["survived"] for r in rows),
            "epochs_lost_median": round(median([r["epochs_lost"] for r in rows]), 2),
            "time_to_recover_s_median": round(median([r["time_to_recover_s"] for r in rows]), 2),
            "time_to_recover_s": [r["time_to_recover_s"] for r in rows],
            "models_exported": [r["models_exported"] for r in rows],
            "half_written": [len(r["half_written"]) for r in rows],
        }
    return out


def fault_table(result: dict[str, Any]) -> list[str]:
    """The README's table, from a faults.json record."""
    lines = [
        "| Fault | Recovery | Survived | Epochs lost | Time to recover (s) | Models | "
        "Half-written files |",
        "|---|---|---|---|---|---|---|",
    ]
    order = {name: i for i, name in enumerate(RUNNERS)}  # the JSON's keys come back sorted
    for fault, s in sorted(result["summary"].items(), key=lambda kv: order.get(kv[0], 99)):
        label, how = LABELS.get(fault, (fault, ""))
        times = s["time_to_recover_s"]
        lines.append(
            f"| {label} | {how} | {s['survived']}/{s['trials']} | {s['epochs_lost_median']:g} | "
            f"{s['time_to_recover_s_median']:g} ({min(times):g}–{max(times):g}) | "
            f"{', '.join(map(str, s['models_exported']))} | "
            f"{', '.join(map(str, s['half_written']))} |"
        )
    return lines


README_BEGIN = "<!-- faults table: python -m bench.faults --readme docs/reliability.md -->"
README_END = "<!-- end of faults table -->"


def write_readme_table(result: dict[str, Any], readme: Path) -> None:
    """Replace the table between the README's faults-table markers."""
    text = readme.read_text()
    if README_BEGIN not in text or README_END not in text:
        raise ValueError(f"{readme}: no {README_BEGIN!r} ... {README_END!r} markers")
    head, rest = text.split(README_BEGIN, 1)
    _, tail = rest.split(README_END, 1)
    table = "\n".join(fault_table(result))
    readme.write_text(f"{head}{README_BEGIN}\n{table}\n{README_END}{tail}")
    print(f"wrote the faults table into {readme}", flush=True)


def _run_all(b: Bench, names: list[str], repeats: int) -> list[dict[str, Any]]:
    """Every chosen fault, `repeats` trials each, round by round."""
    records = []
    for trial in range(repeats):
        for name in names:
            b.trial = trial
            print(f"  [{name}] trial {trial + 1}/{repeats}", flush=True)
            t0 = time.monotonic()
            row = RUNNERS[name](b)
            row["trial_seconds"] = round(time.monotonic() - t0, 1)
            print(f"    survived={row['survived']} epochs_lost={row['epochs_lost']} "
                  f"recover={row['time_to_recover_s']} s models={row['models_exported']} "
                  f"half_written={len(row['half_written'])}", flush=True)  # fmt: skip
            records.append(row)
    return records


def main(argv: list[str] | None = None) -> int:
    """Run the faults; write faults.json (and, with --readme, the README's table)."""
    p = base_parser(__doc__ or NAME)
    p.add_argument("--model", default="small", help="model to train (default: small)")
    p.add_argument("--only", default=",".join(RUNNERS), help="comma-separated faults")
    p.add_argument("--readme", type=Path, default=None, help="README whose table to rewrite")
    a = p.parse_args(argv)
    names = [n for n in a.only.split(",") if n]
    if unknown := sorted(set(names) - set(RUNNERS)):
        p.error(f"unknown faults {unknown}; known: {', '.join(RUNNERS)}")
    repeats, size = (1, "quick") if a.quick else (a.repeats, "full")
    before = machine_state()
    work = scratch(a.work, NAME)
    from standins.fake_gcs import fake_gcs_server

    with fake_gcs_server(work / "fake-gcs-server.log") as emulator:
        b = Bench(work=work, size=size, model=a.model, emulator=emulator)
        b.data = b.prepare(str(fresh(work / "data")))
        records = _run_all(b, names, repeats)
    result = {
        "settings": {"model": a.model, "workers": 2, "threads_per_worker": 1, "epochs": b.epochs,
                     "batch_size_per_worker": BATCH_SIZE_PER_WORKER,
                     "train_samples": TRAIN_LIMIT[size] or 4000, "repeats": repeats,
                     "gcs_fault_share": GCS_SHARE, "stall_env": STALL_ENV},
        "machine_before": before,
        "summary": summarise(records),
        "all_survived": all(r["survived"] for r in records),
        "records": records,
    }  # fmt: skip
    write_result(NAME, result, a.out)
    if a.readme:
        write_readme_table(result, a.readme)
    return 0 if result["all_survived"] else 1
