"""The faults of one local job (`launch.run_local` under real ``horovodrun --gloo``): a rank
SIGKILLed (static and elastic jobs), a rank SIGSTOPped, and damaged checkpoints resumed."""

from __future__ import annotations

import json
import os
import shutil
import signal
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from bench.faults.runs import STALL_ENV, Bench, LaunchThread, progress_at, record, resumed_epoch
from components.train.config import TrainConfig
from standins.outputs import half_written, models_exported


def _signal_rank_mid_epoch(run: LaunchThread, sig: int, rank: int = 1) -> tuple[float, int]:
    """Half an epoch after the 2nd checkpoint, send `sig` to `rank`; (when, its pid)."""
    from standins.commands import rank_processes

    second = run.wait_for(r"checkpoint after epoch 2 written")
    first = run.first(r"checkpoint after epoch 1 written")
    assert first is not None
    time.sleep(max(0.0, (second - first[0]) / 2 - (time.monotonic() - second)))
    pid = rank_processes(os.getpid())[rank].pid
    os.kill(pid, sig)
    return time.monotonic(), pid


def _rerun(b: Bench, config: TrainConfig, fault_at: float, lines: list[Any]) -> dict[str, Any]:
    """Run the job again (a retry); the common figures of a fault that the rerun recovers."""
    rerun = LaunchThread(config, b.env()).start()
    code = rerun.wait()
    resumed = resumed_epoch(rerun.lines)
    progress = progress_at(lines, fault_at)
    return {
        "rerun_exit": code,
        "resumed_from_epoch": resumed[1] if resumed else None,
        "epochs_lost": progress - resumed[1] if resumed else progress,
        "time_to_recover_s": (resumed[0] if resumed else rerun.ended) - fault_at,
        "models_exported": models_exported(config.output),
        "half_written": half_written(config.output),
    }


def static_sigkill(b: Bench) -> dict[str, Any]:
    """A rank SIGKILLed mid-epoch of a static job; the job fails, a rerun resumes."""
    config = b.config(b.data, str(b.out("static_sigkill")), b.epochs)
    first = LaunchThread(config, b.env()).start()
    killed_at, pid = _signal_rank_mid_epoch(first, signal.SIGKILL)
    code = first.wait()
    figures = _rerun(b, config, killed_at, first.lines)
    survived = code != 0 and figures["rerun_exit"] == 0 and figures["resumed_from_epoch"]
    return record(
        "static_sigkill", b.trial, bool(survived), **figures, killed_rank=1, killed_pid=pid,
        first_exit=code, failed_after_s=round(first.ended - killed_at, 2),
    )  # fmt: skip


WENT_ON = r"the job goes on as ONE job of (\d+) workers from epoch (\d+)"


def elastic_sigkill(b: Bench) -> dict[str, Any]:
    """A rank SIGKILLed mid-epoch of an elastic job of 3 (at least 2): it goes on with 2."""
    out = b.out("elastic_sigkill")
    config = replace(b.config(b.data, str(out), b.epochs), workers=3, min_workers=2)
    run = LaunchThread(config, b.env()).start()
    killed_at, pid = _signal_rank_mid_epoch(run, signal.SIGKILL)
    code = run.wait()
    went_on = run.first(WENT_ON)
    done_before = int(went_on[1].group(2)) - 1 if went_on else 0  # epochs kept at the loss
    summary_path = out / "run_summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.exists() else {}
    elastic = summary.get("elastic", {"world_size_history": [], "epochs": []})
    sizes = [h["world_size"] for h in elastic["world_size_history"]]
    covered = [e["epoch"] for e in elastic["epochs"] if e["disjoint"] and e["covers_all"]]
    survived = (
        code == 0 and went_on is not None and sizes == [3, 2]
        and covered == list(range(1, config.epochs + 1))
        and summary.get("weights_identical_across_ranks") is True
    )  # fmt: skip
    return record(
        "elastic_sigkill", b.trial, survived,
        epochs_lost=progress_at(run.lines, killed_at) - done_before,
        time_to_recover_s=went_on[0] - killed_at if went_on else float("nan"),
        models_exported=models_exported(config.output), half_written=half_written(config.output),
        killed_rank=1, killed_pid=pid, exit=code, world_sizes=sizes,
        epochs_covered_exactly_once=len(covered), job_seconds=round(run.ended - run.started, 2),
    )  # fmt: skip


def sigstop(b: Bench) -> dict[str, Any]:
    """A rank stopped (SIGSTOP) mid-epoch, under the short stall bound: the watch names it
    alone and ends the job, a rerun resumes. How long that took is a figure (with the bound it
    is within on an idle machine), not a condition: a loaded machine delays it."""
    from components.common.failure import ExitCode
    from components.train.launcher.mpiwatch import POLL_SECONDS
    from components.train.rank.heartbeat import period_for

    config = b.config(b.data, str(b.out("sigstop")), b.epochs)
    first = LaunchThread(config, b.env(**STALL_ENV)).start()
    stopped_at, pid = _signal_rank_mid_epoch(first, signal.SIGSTOP)
    code = first.wait()
    named = ended = first.first(r"mpiwatch: the job failed: rank 1 on ")
    # its last beat within a period of the stop, ended at the first poll past the bound (+ 0.5 s)
    stall = float(STALL_ENV["HOROVOD_STALL_SHUTDOWN_TIME_SECONDS"])
    bound = stall + period_for(stall) + 2 * POLL_SECONDS + 0.5
    ended_after = ended[0] - stopped_at if ended else float("nan")
    figures = _rerun(b, config, stopped_at, first.lines)
    survived = code == ExitCode.SILENT_RANK and named and figures["rerun_exit"] == 0
    return record(
        "sigstop", b.trial, bool(survived), **figures, stopped_rank=1,
        named_after_s=round(named[0] - stopped_at, 2) if named else None,
        ended_after_s=round(ended_after, 2), bound_s=bound, first_exit=code,
        job_exit_after_s=round(first.ended - stopped_at, 2),
        stall_settings=STALL_ENV,
    )  # fmt: skip


def _damaged(b: Bench, fault: str, damage: Callable[[Path], None], resumes: int) -> dict[str, Any]:
    """Damage a copy of the base run's checkpoints; a 3-epoch run resumes from `resumes`."""
    out = b.out(fault)
    shutil.copytree(b.base_checkpoints(), out / "checkpoints")
    damage(out / "checkpoints")
    run = LaunchThread(b.config(b.data, str(out), 3), b.env()).start()
    code = run.wait()
    said = [line for _, line in run.lines if "; resuming from epoch" in line]
    resumed = resumed_epoch(run.lines)
    survived = code == 0 and len(said) == 1 and resumed is not None and resumed[1] == resumes
    return record(
        fault, b.trial, survived, epochs_lost=2 - (resumed[1] if resumed else 0),
        time_to_recover_s=(resumed[0] if resumed else run.ended) - run.started,
        models_exported=models_exported(str(out)), half_written=half_written(str(out)),
        exit=code, resumed_from_epoch=resumed[1] if resumed else None,
        said=said[0].split("] ", 1)[-1] if said else None,
    )  # fmt: skip


DATA_FILE = "ckpt-2.data-00000-of-00001"  # epoch 2's, the newest


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def checkpoint_truncated(b: Bench) -> dict[str, Any]:
    """The latest checkpoint's data file cut to half its size."""
    return _damaged(b, "checkpoint_truncated", lambda c: _truncate(c / DATA_FILE), 1)


def checkpoint_deleted(b: Bench) -> dict[str, Any]:
    """The latest checkpoint's data file deleted."""
    return _damaged(b, "checkpoint_deleted", lambda c: (c / DATA_FILE).unlink(), 1)


def _cut_state_file(checkpoints: Path) -> None:
    (checkpoints / "checkpoint").write_text('model_checkpoint_path: "ckpt-')


def state_file_corrupt(b: Bench) -> dict[str, Any]:
    """The checkpoint state file cut short (the checkpoints themselves are intact)."""
    return _damaged(b, "state_file_corrupt", _cut_state_file, 2)
