"""``python -m bench.faults``: does a run survive each fault, and what does the fault cost?

Each fault in `RUNNERS` runs `--repeats` times (N, 3 by default) against the real parts: the
trainer under real ``horovodrun --gloo`` through the local launcher (`launch.run_local`), the
real google-cloud-storage client against fake-gcs-server (`standins.fake_gcs`; issue 11 names
gcp-storage-emulator, the project moved to fake-gcs-server), and the MPIJob backend
(`run_mpijob`) with the real kubernetes client against kmock (`standins.kmock_cluster`, where the
MPIJob's launcher is the stored manifest's trainer command run by horovodrun on this machine;
what kmock cannot do, that module plays and says so). Every trial is one record:

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

import contextlib
import itertools
import json
import logging
import os
import re
import shutil
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from bench.common import base_parser, machine_state, median, scratch, write_result
from components.common import storage
from components.common.defaults import BATCH_SIZE_PER_WORKER
from components.train.config import TrainConfig

NAME = "faults"
EPOCHS = {"full": 6, "quick": 4}
TRAIN_LIMIT = {"full": 0, "quick": 1000}  # bundled digits: 4,000 train / 1,000 test (0: all)
GCS_SHARE = 0.1  # of GCS requests answered 503 or 429
# Short stall settings for the frozen rank (job_environment keeps what is set).
STALL_ENV = {"HOROVOD_STALL_CHECK_TIME_SECONDS": "2", "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": "5"}
JOB_TIMEOUT_S = 600
CHECKPOINT_LINE = re.compile(r"checkpoint after epoch (\d+) written")
RESUME_LINE = re.compile(r"resuming from checkpoint after epoch (\d+) of")
RETRY_LINE = re.compile(r"GCS \w+ \S+ failed: .*; retrying")


# --- running a local job, every line stamped -------------------------------------------------


@dataclass
class Job:
    """`launch.run_local` in a thread; `lines` are (monotonic time, line) as they arrive."""

    config: TrainConfig
    env: dict[str, str]
    lines: list[tuple[float, str]] = field(default_factory=list)
    code: int | None = None
    started: float = 0.0
    ended: float = 0.0

    def start(self) -> Job:
        from components.train.launch import run_local

        def run() -> None:
            stamp = lambda line: self.lines.append((time.monotonic(), line))  # noqa: E731
            try:
                self.code = run_local(self.config, JOB_TIMEOUT_S, stamp, self.env)
            finally:
                self.ended = time.monotonic()

        self.started = time.monotonic()
        self._thread = threading.Thread(target=run, daemon=True)
        self._thread.start()
        return self

    def wait(self) -> int:
        self._thread.join(JOB_TIMEOUT_S + 60)
        if self.code is None:
            raise RuntimeError(f"job did not finish: {self.tail()}")
        return self.code

    def first(self, pattern: str | re.Pattern[str]) -> tuple[float, re.Match[str]] | None:
        """When the first line matching `pattern` came, and the match."""
        for t, line in list(self.lines):
            if m := re.search(pattern, line):
                return t, m
        return None

    def wait_for(self, pattern: str) -> float:
        """Block until a line matches `pattern`; its time. Raises if the job ends first."""
        while (hit := self.first(pattern)) is None:
            if not self._thread.is_alive():
                raise RuntimeError(f"job ended before {pattern!r}: {self.tail()}")
            time.sleep(0.02)
        return hit[0]

    def tail(self, n: int = 30) -> str:
        return "\n".join(line for _, line in self.lines[-n:])


def progress_at(lines: list[tuple[float, str]], t: float) -> float:
    """Epochs of training done at time `t`: the last checkpoint before it, plus the part of an
    epoch since (median time between checkpoints as the epoch's length)."""
    marks = [(ts, int(m.group(1))) for ts, line in lines if (m := CHECKPOINT_LINE.search(line))]
    before = [(ts, k) for ts, k in marks if ts <= t]
    if not before:
        return 0.0
    ts, k = before[-1]
    gaps = [b[0] - a[0] for a, b in itertools.pairwise(marks)]
    return k + min(1.0, (t - ts) / median(gaps)) if gaps else float(k)


def resumed_epoch(lines: list[tuple[float, str]]) -> tuple[float, int] | None:
    """When the rerun said it resumed, and from which epoch."""
    for ts, line in lines:
        if m := RESUME_LINE.search(line):
            return ts, int(m.group(1))
    return None


# --- what a run leaves behind ----------------------------------------------------------------


def models_exported(root: str) -> int:
    """``saved_model.pb`` files under `root` (local or gs://)."""
    return sum(f.endswith("/saved_model.pb") for f in storage.list_files(root))


def _owner(rel: str) -> tuple[str, str] | None:
    """The directory a file belongs to and the file that makes it complete, if any."""
    parts = rel.split("/")
    for i, part in enumerate(parts[:-1]):
        if re.fullmatch(r"epoch-\d{4,}", part):
            return "/".join(parts[: i + 1]), "checkpoint.json"
        if part == "variables":
            return "/".join(parts[:i]), "saved_model.pb"
        if part in ("train", "test") and parts[-1].endswith(".npy"):
            return "/".join(parts[:i]), "manifest.json"
    return None


def half_written(root: str) -> list[str]:
    """Files under `root` left partial: temporary or staging names, and files of a directory
    whose completing file is missing (see the module docstring)."""
    prefix = root.rstrip("/") + "/"
    rels = [f[len(prefix) :] if f.startswith(prefix) else f for f in storage.list_files(root)]
    present = set(rels)
    bad = []
    for rel in rels:
        parts, owner = rel.split("/"), _owner(rel)
        staged = any(p.startswith(".") for p in parts) or "_staging" in parts
        incomplete = owner is not None and "/".join(filter(None, owner)) not in present
        if staged or incomplete:
            bad.append(rel)
    return bad


def record(fault: str, trial: int, survived: bool, **figures: Any) -> dict[str, Any]:
    """One trial's record: the figures every fault has, then the fault's details."""
    keys = ("epochs_lost", "time_to_recover_s", "models_exported", "half_written")
    lost, recover, models, half = (figures.pop(k) for k in keys)
    return {
        "fault": fault,
        "trial": trial,
        "survived": bool(survived and models == 1 and not half),
        "epochs_lost": round(float(lost), 2),
        "time_to_recover_s": round(float(recover), 2),
        "models_exported": models,
        "half_written": half,
        "details": figures,
    }


# --- the bench's shared parts -----------------------------------------------------------------


@dataclass
class Bench:
    """What the runners share: sizes, the model, scratch space, the GCS emulator, a dataset."""

    work: Path
    size: str  # full | quick
    model: str
    emulator: str
    data: str = ""
    trial: int = 0
    _buckets: Iterator[int] = field(default_factory=itertools.count)
    _base: Path | None = None

    @property
    def epochs(self) -> int:
        return EPOCHS[self.size]

    def config(self, data: str, output: str, epochs: int) -> TrainConfig:
        """A 2-rank job of the chosen model, one thread per rank."""
        return TrainConfig(
            data=data, output=output, workers=2, epochs=epochs, threads_per_worker=1,
            model=self.model,
        )  # fmt: skip

    def out(self, fault: str) -> Path:
        path = self.work / f"{fault}-{self.trial}"
        shutil.rmtree(path, ignore_errors=True)
        return path

    def env(self, **extra: str) -> dict[str, str]:
        return {**os.environ, **STALL_ENV, **extra}

    def bucket(self) -> str:
        """A new bucket in the emulator, as ``gs://name``."""
        from standins.fake_gcs import create_bucket

        name = f"faults-{os.getpid()}-{next(self._buckets)}"
        create_bucket(self.emulator, name)
        return f"gs://{name}"

    def prepare(self, output: str) -> str:
        from components.data_prep.prep import prepare

        prepare("bundled", output, shard_size=1000, limit=TRAIN_LIMIT[self.size])
        return output

    def base_checkpoints(self) -> Path:
        """The checkpoints of a finished 2-epoch run (epochs 1 and 2), made once."""
        if self._base is None:
            out = self.work / "base-run"
            shutil.rmtree(out, ignore_errors=True)
            job = Job(self.config(self.data, str(out), 2), self.env()).start()
            if job.wait() != 0:
                raise RuntimeError(f"the base run failed: {job.tail()}")
            self._base = out / "checkpoints"
        return self._base


@contextlib.contextmanager
def gcs_host(url: str) -> Iterator[None]:
    """This process's GCS client talks to `url` within the block."""
    saved = {k: os.environ.get(k) for k in ("STORAGE_EMULATOR_HOST", "GOOGLE_CLOUD_PROJECT")}
    os.environ.update({"STORAGE_EMULATOR_HOST": url, "GOOGLE_CLOUD_PROJECT": "emulator"})
    storage._client.cache_clear()
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        storage._client.cache_clear()


# --- the runners: one per fault ---------------------------------------------------------------


def _signal_rank_mid_epoch(job: Job, sig: int, rank: int = 1) -> tuple[float, int]:
    """Half an epoch after the 2nd checkpoint, send `sig` to `rank`; (when, its pid)."""
    from components.train.rankwatch import rank_processes

    second = job.wait_for(r"checkpoint after epoch 2 written")
    first = job.first(r"checkpoint after epoch 1 written")
    assert first is not None
    time.sleep(max(0.0, (second - first[0]) / 2 - (time.monotonic() - second)))
    pid = rank_processes(os.getpid())[rank].pid
    os.kill(pid, sig)
    return time.monotonic(), pid


def _rerun(b: Bench, config: TrainConfig, fault_at: float, lines: list[Any]) -> dict[str, Any]:
    """Run the job again (a retry); the common figures of a fault that the rerun recovers."""
    rerun = Job(config, b.env()).start()
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
    first = Job(config, b.env()).start()
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
    job = Job(config, b.env()).start()
    killed_at, pid = _signal_rank_mid_epoch(job, signal.SIGKILL)
    code = job.wait()
    went_on = job.first(WENT_ON)
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
        epochs_lost=progress_at(job.lines, killed_at) - done_before,
        time_to_recover_s=went_on[0] - killed_at if went_on else float("nan"),
        models_exported=models_exported(config.output), half_written=half_written(config.output),
        killed_rank=1, killed_pid=pid, exit=code, world_sizes=sizes,
        epochs_covered_exactly_once=len(covered), job_seconds=round(job.ended - job.started, 2),
    )  # fmt: skip


def sigstop(b: Bench) -> dict[str, Any]:
    """A rank stopped (SIGSTOP) mid-epoch: named, the job ended within the stall bound, rerun."""
    from components.train.rankwatch import POLL_SECONDS

    config = b.config(b.data, str(b.out("sigstop")), b.epochs)
    first = Job(config, b.env()).start()
    stopped_at, pid = _signal_rank_mid_epoch(first, signal.SIGSTOP)
    code = first.wait()
    named = first.first(rf"launcher: rank 1 \(pid {pid}\) is stopped")
    ended = first.first(rf"launcher: rank 1 \(pid {pid}\) has been stopped .* ending the job")
    # first seen within a poll of the stop, killed at the first poll past the bound (+ 0.5 s slack)
    bound = float(STALL_ENV["HOROVOD_STALL_SHUTDOWN_TIME_SECONDS"]) + 2 * POLL_SECONDS + 0.5
    ended_after = ended[0] - stopped_at if ended else float("nan")
    figures = _rerun(b, config, stopped_at, first.lines)
    survived = code != 0 and named and ended_after <= bound and figures["rerun_exit"] == 0
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
    job = Job(b.config(b.data, str(out), 3), b.env()).start()
    code = job.wait()
    said = [line for _, line in job.lines if "; resuming from epoch" in line]
    resumed = resumed_epoch(job.lines)
    survived = code == 0 and len(said) == 1 and resumed is not None and resumed[1] == resumes
    return record(
        fault, b.trial, survived, epochs_lost=2 - (resumed[1] if resumed else 0),
        time_to_recover_s=(resumed[0] if resumed else job.ended) - job.started,
        models_exported=models_exported(str(out)), half_written=half_written(str(out)),
        exit=code, resumed_from_epoch=resumed[1] if resumed else None,
        said=said[0].split("] ", 1)[-1] if said else None,
    )  # fmt: skip


DATA_FILE = "ckpt.data-00000-of-00001"


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def checkpoint_truncated(b: Bench) -> dict[str, Any]:
    """The latest checkpoint's data file cut to half its size."""
    return _damaged(b, "checkpoint_truncated", lambda c: _truncate(c / "epoch-0002" / DATA_FILE), 1)


def checkpoint_deleted(b: Bench) -> dict[str, Any]:
    """The latest checkpoint's data file deleted."""
    return _damaged(b, "checkpoint_deleted", lambda c: (c / "epoch-0002" / DATA_FILE).unlink(), 1)


def _cut_latest_json(checkpoints: Path) -> None:
    (checkpoints / "latest.json").write_text('{"epoch": 2, "pr')


def latest_json_corrupt(b: Bench) -> dict[str, Any]:
    """``latest.json`` cut short (its epoch's own checkpoint.json is intact)."""
    return _damaged(b, "latest_json_corrupt", _cut_latest_json, 2)


class _Retries(logging.Handler):
    """Counts the storage layer's retry lines in this process."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, rec: logging.LogRecord) -> None:
        self.lines.append(rec.getMessage())


@contextlib.contextmanager
def _counting_retries() -> Iterator[_Retries]:
    counter = _Retries()
    logger = logging.getLogger(storage.__name__)
    logger.addHandler(counter)
    try:
        yield counter
    finally:
        logger.removeHandler(counter)


def _gcs_chain(b: Bench, proxy: Any, bucket: str, counter: _Retries) -> dict[str, dict[str, int]]:
    """Data prep, a 2-rank job, evaluation and registration through the proxy; for each step,
    the faults injected and the retries logged (here, and by the job's ranks)."""
    from components.evaluate.evaluate import evaluate
    from components.register.register import register

    data, output = f"{bucket}/data", f"{bucket}/runs/r{b.trial}"
    config = b.config(data, output, 2 if b.size == "full" else 1)
    steps: dict[str, dict[str, int]] = {}

    def step(name: str, run: Callable[[], Any], in_job: Callable[[], int] = lambda: 0) -> Any:
        injected, logged = len(proxy.injected), len(counter.lines)
        out = run()
        steps[name] = {"injected": len(proxy.injected) - injected,
                       "retries_logged": len(counter.lines) - logged + in_job()}  # fmt: skip
        return out

    step("data_prep", lambda: b.prepare(data))
    job = Job(config, b.env(STORAGE_EMULATOR_HOST=proxy.url, GOOGLE_CLOUD_PROJECT="emulator"))
    step("train", lambda: _succeed(job), lambda: _retry_lines(job))
    summary = json.loads(storage.read_text(config.summary_uri))
    scores = step("evaluate", lambda: evaluate(summary["model_uri"], data))
    decision = step("register", lambda: register(
        summary["model_uri"], config.summary_uri, data, scores.accuracy, scores.loss,
        registry_root=f"{bucket}/models", pipeline_run_id=f"faults-{b.trial}", min_accuracy=0.0,
    ))  # fmt: skip
    steps["train"]["resumed_from_epoch"] = int(summary["resumed_from_epoch"])
    steps["register"]["version"] = decision.version if decision.registered else 0
    return steps


def _succeed(job: Job) -> Job:
    """Run `job`; raise with its output's tail unless it succeeds."""
    if job.start().wait() != 0:
        raise RuntimeError(f"the job failed: {job.tail()}")
    return job


def _retry_lines(job: Job) -> int:
    """The storage layer's retry lines the job's ranks printed."""
    return sum(1 for _, line in job.lines if RETRY_LINE.search(line))


def gcs_transient(b: Bench) -> dict[str, Any]:
    """503 and 429 on a share of GCS requests through the whole chain; each retry logged once."""
    from standins.fake_gcs import FaultProxy

    bucket = b.bucket()
    with FaultProxy(b.emulator, share=GCS_SHARE, seed=b.trial) as proxy, gcs_host(proxy.url):
        with _counting_retries() as counter:
            steps = _gcs_chain(b, proxy, bucket, counter)
        proxy.share = 0.0
        output = f"{bucket}/runs/r{b.trial}"
        models, half = models_exported(output), half_written(bucket)
        recoveries = proxy.recoveries()
        statuses = sorted({r.status for r in proxy.injected})
    injected = sum(s["injected"] for s in steps.values())
    logged = sum(s["retries_logged"] for s in steps.values())
    survived = injected > 0 and all(s["injected"] == s["retries_logged"] for s in steps.values())
    survived = survived and steps["register"]["version"] == 1
    return record(
        "gcs_transient", b.trial, survived, epochs_lost=steps["train"]["resumed_from_epoch"],
        time_to_recover_s=max(recoveries, default=0.0), models_exported=models,
        half_written=half, share=GCS_SHARE, statuses=statuses, injected=injected,
        retries_logged=logged, requests=len(proxy.requests), steps=steps,
        median_recovery_s=round(median(recoveries), 2),
    )  # fmt: skip


def _mpijob_params(b: Bench, bucket: str, run_id: str) -> Any:
    """An MPIJob run of the 2-rank job on a dataset prepared in `bucket` (no faults)."""
    from components.train.mpijob.manifest import MPIJobParams

    data = b.prepare(f"{bucket}/data")
    train = b.config(data, f"{bucket}/runs/{run_id}", b.epochs)
    return MPIJobParams(run_name="faults", train=train, pipeline_run_id=run_id)


def _stamped(lines: list[tuple[float, str]]) -> Callable[[str], None]:
    return lambda line: lines.append((time.monotonic(), line))


class _PodLost(BaseException):
    """The train task's pod is gone (raised from its log callback, as nothing catches it)."""


def kfp_retry(b: Bench) -> dict[str, Any]:
    """The train task's pod lost after the first epoch; KFP's retry reattaches to its MPIJob."""
    from components.train.mpijob.lifecycle import run_mpijob
    from standins.kmock_cluster import NS, Cluster, TrainerOperator

    bucket = b.bucket()
    with gcs_host(b.emulator), Cluster() as cluster:
        p = _mpijob_params(b, bucket, f"retry-{b.trial}")
        op = TrainerOperator(cluster, b.env(**_emulator_env(b)))
        op.play(_serve_one)
        lost: list[float] = []

        def lose_pod(line: str) -> None:
            if "] Epoch 1/" in line:
                lost.append(time.monotonic())
                raise _PodLost()

        with contextlib.suppress(_PodLost):
            run_mpijob(p, namespace=NS, api_client=cluster.api, poll_interval_s=0.2, log=lose_pod)
        lines: list[tuple[float, str]] = []
        summary = run_mpijob(
            p, namespace=NS, api_client=cluster.api, poll_interval_s=0.2, log=_stamped(lines)
        )
        op.join(JOB_TIMEOUT_S)
        back = next((t for t, line in lines if line.startswith("reattached to MPIJob")), None)
        jobs, posts = cluster.job_names(), len(cluster.requests("POST", "/mpijobs"))
        models, half = models_exported(p.train.output), half_written(bucket)
    survived = back is not None and op.starts == 1 and len(jobs) == 1
    return record(
        "kfp_retry", b.trial, survived, epochs_lost=summary["resumed_from_epoch"],
        time_to_recover_s=(back or float("nan")) - lost[0], models_exported=models,
        half_written=half, trainer_launches=op.starts, mpijobs=jobs, create_requests=posts,
        said=next((line for _, line in lines if line.startswith("reattached")), None),
    )  # fmt: skip


def _serve_one(op: Any) -> None:
    """The operator's script: serve the next MPIJob created."""
    op.serve(op.wait_for_job())


def _emulator_env(b: Bench) -> dict[str, str]:
    return {"STORAGE_EMULATOR_HOST": b.emulator, "GOOGLE_CLOUD_PROJECT": "emulator"}


def _sigterm_mid_epoch(op: Any, sent: list[float]) -> None:
    """Half an epoch after the 2nd checkpoint line of the operator's trainer, SIGTERM this
    process (KFP cancelling the task)."""
    while (len(marks := [t for t, line in op.lines if CHECKPOINT_LINE.search(line)])) < 2:
        time.sleep(0.02)
    time.sleep(max(0.0, (marks[1] - marks[0]) / 2 - (time.monotonic() - marks[1])))
    sent.append(time.monotonic())
    os.kill(os.getpid(), signal.SIGTERM)


def _alive(pid: int) -> bool:
    import psutil

    try:
        return bool(psutil.Process(pid).status() != psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return False


def _cancel_once(b: Bench, cluster: Any, op: Any, p: Any) -> dict[str, Any]:
    """Run the job and cancel it mid-training; what was left, and when it was all gone."""
    from components.train.mpijob.lifecycle import MPIJobCancelled, run_mpijob
    from standins.kmock_cluster import NS

    sent: list[float] = []

    def script(op: Any) -> None:
        name = op.wait_for_job()
        threading.Thread(target=_sigterm_mid_epoch, args=(op, sent), daemon=True).start()
        op.serve(name)

    op.play(script)
    gone_at = None
    with contextlib.suppress(MPIJobCancelled):
        run_mpijob(p, namespace=NS, api_client=cluster.api, poll_interval_s=0.2, log=lambda _: None)
    if sent:
        gone_at = time.monotonic()
    op.join(60)
    return {
        "sent": sent[0] if sent else float("nan"),
        "cleanup_s": (gone_at - sent[0]) if gone_at and sent else float("nan"),
        "left": {
            "mpijobs": cluster.job_names(),
            "pods": [n for n in cluster.pod_names() if n != "unrelated"],
            "rank_processes": [pid for pid in op.collected if _alive(pid)],
        },
        "ranks_killed": len(op.collected),
    }


def cancel(b: Bench) -> dict[str, Any]:
    """SIGTERM to the train task: the MPIJob deleted, nothing left; the retried run resumes."""
    from components.train.mpijob.lifecycle import run_mpijob
    from standins.kmock_cluster import NS, Cluster, TrainerOperator

    bucket = b.bucket()
    previous = signal.signal(signal.SIGTERM, lambda *_: None)  # a late SIGTERM stops nothing
    try:
        with gcs_host(b.emulator), Cluster() as cluster:
            p = _mpijob_params(b, bucket, f"cancel-{b.trial}")
            op = TrainerOperator(cluster, b.env(**_emulator_env(b)))
            cancelled = _cancel_once(b, cluster, op, p)
            progress = progress_at(op.lines, op.killed_at or cancelled["sent"])
            op.play(_serve_one)
            summary = run_mpijob(
                p, namespace=NS, api_client=cluster.api, poll_interval_s=0.2, log=lambda _: None
            )
            op.join(JOB_TIMEOUT_S)
            models, half = models_exported(p.train.output), half_written(bucket)
    finally:
        signal.signal(signal.SIGTERM, previous)
    nothing_left = cancelled["ranks_killed"] > 0 and not any(cancelled["left"].values())
    return record(
        "cancel", b.trial, nothing_left and op.starts == 2,
        epochs_lost=progress - summary["resumed_from_epoch"],
        time_to_recover_s=cancelled["cleanup_s"], models_exported=models, half_written=half,
        left_after_cancel=cancelled["left"], ranks_killed=cancelled["ranks_killed"],
        rerun_resumed_from_epoch=summary["resumed_from_epoch"],
    )  # fmt: skip


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


README_BEGIN = "<!-- faults table: python -m bench.faults --readme README.md -->"
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
        b.data = b.prepare(str(fresh_dir(work / "data")))
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


def fresh_dir(path: Path) -> Path:
    shutil.rmtree(path, ignore_errors=True)
    return path


if __name__ == "__main__":
    sys.exit(main())
