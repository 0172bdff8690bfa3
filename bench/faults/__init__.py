"""``python -m bench.faults``: does a run survive each fault, and what does the fault cost?

Each fault in `RUNNERS` runs `--repeats` times (N, 3 by default) against the real parts: the
trainer under real ``horovodrun --gloo`` (`bench.faults.local`), the real GCS client against
fake-gcs-server, and the MPIJob backend with the real kubernetes client against kmock
(`bench.faults.cluster`). Every trial is one record (`bench.faults.runs.record`): whether it
``survived`` (the fault's own checks passed, one model exported, nothing half-written), the
``epochs_lost``, the ``time_to_recover_s``, the ``models_exported`` and the ``half_written``
files (`standins.outputs`). docs/reliability.md says what each fault does, how its time to
recover is measured, and shows the table `--readme docs/reliability.md` writes there.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from bench.common import (
    bench_main,
    bench_options,
    comma_names,
    fresh,
    machine_state,
    median,
    scratch,
    write_result,
)
from bench.faults import cluster, local
from bench.faults.runs import GCS_SHARE, STALL_ENV, TRAIN_LIMIT, Bench
from components.common.defaults import BATCH_SIZE_PER_WORKER

NAME = "faults"


# --- the registry, the summary and the table ----------------------------------------------------

Runner = Callable[[Bench], dict[str, Any]]
# One runner per fault, in the table's order.
RUNNERS: dict[str, Runner] = {
    "static_sigkill": local.static_sigkill,
    "elastic_sigkill": local.elastic_sigkill,
    "sigstop": local.sigstop,
    "gcs_transient": cluster.gcs_transient,
    "checkpoint_truncated": local.checkpoint_truncated,
    "checkpoint_deleted": local.checkpoint_deleted,
    "state_file_corrupt": local.state_file_corrupt,
    "kfp_retry": cluster.kfp_retry,
    "cancel": cluster.cancel,
}
# Trials of a fault when more than `--repeats` (a full run only; --quick runs one of each): the
# elastic loss, whose recovery Gloo's timeout stalled in 1 to 2 of 3 trials, gets 10.
TRIALS = {"elastic_sigkill": 10}
LABELS = {
    "static_sigkill": ("rank SIGKILLed mid-epoch (static job)", "job fails; rerun resumes"),
    "elastic_sigkill": ("rank SIGKILLed mid-epoch (elastic job, 3 workers, min 2)",
                        "the other 2 go on (a survivor's wait bounded by Gloo's 5 s timeout); "
                        "the interrupted epoch runs again"),
    "sigstop": ("rank hangs (SIGSTOP)", "launcher names it, ends the job at the stall bound; "
                "rerun resumes"),
    "gcs_transient": ("GCS 503/429 on 10% of requests", "each call retried (logged once)"),
    "checkpoint_truncated": ("latest checkpoint truncated", "resume from the one before"),
    "checkpoint_deleted": ("latest checkpoint's data deleted", "resume from the one before"),
    "state_file_corrupt": ("checkpoint state file corrupt", "resume from the newest intact epoch"),
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


def trials(name: str, repeats: int, quick: bool) -> int:
    """How many trials of fault `name` a run makes: `repeats`, or its `TRIALS` if more."""
    return 1 if quick else max(repeats, TRIALS.get(name, 0))


def _run_all(b: Bench, names: list[str], repeats: int, quick: bool) -> list[dict[str, Any]]:
    """Every chosen fault, its `trials` each, round by round."""
    records = []
    counts = {name: trials(name, repeats, quick) for name in names}
    for trial in range(max(counts.values())):
        for name in (n for n in names if trial < counts[n]):
            b.trial = trial
            print(f"  [{name}] trial {trial + 1}/{counts[name]}", flush=True)
            t0 = time.monotonic()
            row = RUNNERS[name](b)
            row["trial_seconds"] = round(time.monotonic() - t0, 1)
            print(f"    survived={row['survived']} epochs_lost={row['epochs_lost']} "
                  f"recover={row['time_to_recover_s']} s models={row['models_exported']} "
                  f"half_written={len(row['half_written'])}", flush=True)  # fmt: skip
            records.append(row)
    return records


@click.command(help=__doc__)
@bench_options
@click.option("--model", default="small", help="model to train (default: small)")
@click.option(
    "--only",
    "names",
    default=",".join(RUNNERS),
    show_default=True,
    callback=comma_names("faults", list(RUNNERS)),
    help="comma-separated faults",
)
@click.option(
    "--readme",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="README whose table to rewrite",
)
def command(
    out: Path,
    work: Path | None,
    repeats: int,
    quick: bool,
    model: str,
    names: list[str],
    readme: Path | None,
) -> int:
    """Run the faults; write faults.json (and, with --readme, the README's table)."""
    repeats, size = (1, "quick") if quick else (repeats, "full")
    before = machine_state()
    scratch_dir = scratch(work, NAME)
    from standins.fake_gcs import fake_gcs_server

    with fake_gcs_server(scratch_dir / "fake-gcs-server.log") as emulator:
        b = Bench(work=scratch_dir, size=size, model=model, emulator=emulator)
        b.data = b.prepare(str(fresh(scratch_dir / "data")))
        records = _run_all(b, names, repeats, quick)
    result = {
        "settings": {"model": model, "workers": 2, "threads_per_worker": 1, "epochs": b.epochs,
                     "batch_size_per_worker": BATCH_SIZE_PER_WORKER,
                     "train_samples": TRAIN_LIMIT[size] or 4000, "repeats": repeats,
                     "trials": {name: trials(name, repeats, quick) for name in names},
                     "gcs_fault_share": GCS_SHARE, "stall_env": STALL_ENV},
        "machine_before": before,
        "summary": summarise(records),
        "all_survived": all(r["survived"] for r in records),
        "records": records,
    }  # fmt: skip
    write_result(NAME, result, out)
    if readme:
        write_readme_table(result, readme)
    return 0 if result["all_survived"] else 1


def main(argv: list[str] | None = None) -> int:
    return bench_main(command, argv, "bench.faults")
