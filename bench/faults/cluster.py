"""The faults through GCS and the cluster: transient GCS errors through the whole chain (the
real client on fake-gcs-server behind `standins.fake_gcs.FaultProxy`), and the MPIJob backend
(`run_job`, the real kubernetes client against `standins.kmock_cluster`) losing its pod to
a KFP retry or cancelled by SIGTERM."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from bench.common import median
from bench.faults.runs import (
    CHECKPOINT_LINE,
    GCS_SHARE,
    JOB_TIMEOUT_S,
    Bench,
    LaunchThread,
    emulator_env,
    gcs_host,
    progress_at,
    record,
    stamped,
)
from components.common import storage
from components.train import summary as run_summary
from standins.outputs import half_written, models_exported


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
    run = LaunchThread(config, b.env(**emulator_env(proxy.url)))
    step("train", run.succeed, lambda: _retry_lines(run))
    summary = run_summary.read(config.summary_uri)
    scores = step("evaluate", lambda: evaluate(summary.model_uri, data))
    decision = step("register", lambda: register(
        summary.model_uri, config.summary_uri, data, scores.accuracy, scores.loss,
        registry_root=f"{bucket}/models", pipeline_run_id=f"faults-{b.trial}", min_accuracy=0.0,
    ))  # fmt: skip
    steps["train"]["resumed_from_epoch"] = summary.resumed_from_epoch
    steps["register"]["version"] = decision.version if decision.registered else 0
    return steps


def _retry_lines(run: LaunchThread) -> int:
    """The storage layer's retry lines the job's ranks printed."""
    return sum(1 for _, line in run.lines if storage.RETRY_LINE.search(line))


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
    from components.train.launcher.cluster.job import ClusterJobParams

    data = b.prepare(f"{bucket}/data")
    train = b.config(data, f"{bucket}/runs/{run_id}", b.epochs)
    return ClusterJobParams(run_name="faults", train=train, pipeline_run_id=run_id)


def _run_mpijob(cluster: Any, p: Any, log: Any) -> Any:
    """`run_job` of the MPIJob backend against the kmock `cluster`."""
    from components.train.launcher.cluster.mpijob import JOB_KIND
    from components.train.launcher.cluster.run import run_job
    from standins.kmock_cluster import NS

    return run_job(JOB_KIND, p, namespace=NS, api_client=cluster.api, poll_interval_s=0.2, log=log)


class _PodLost(BaseException):
    """The train task's pod is gone (raised from its log callback, as nothing catches it)."""


def kfp_retry(b: Bench) -> dict[str, Any]:
    """The train task's pod lost after the first epoch; KFP's retry reattaches to its MPIJob."""
    from standins.kmock_cluster import Cluster, TrainerOperator

    bucket = b.bucket()
    with gcs_host(b.emulator), Cluster() as cluster:
        p = _mpijob_params(b, bucket, f"retry-{b.trial}")
        op = TrainerOperator(cluster, b.env(**emulator_env(b.emulator)))
        op.play(_serve_one)
        lost: list[float] = []

        def lose_pod(line: str) -> None:
            if "] Epoch 1/" in line:
                lost.append(time.monotonic())
                raise _PodLost()

        with contextlib.suppress(_PodLost):
            _run_mpijob(cluster, p, lose_pod)
        lines: list[tuple[float, str]] = []
        summary = _run_mpijob(cluster, p, stamped(lines))
        op.join(JOB_TIMEOUT_S)
        back = next((t for t, line in lines if line.startswith("reattached to MPIJob")), None)
        jobs, posts = cluster.job_names(), len(cluster.requests("POST", "/mpijobs"))
        models, half = models_exported(p.train.output), half_written(bucket)
    survived = back is not None and op.starts == 1 and len(jobs) == 1
    return record(
        "kfp_retry", b.trial, survived, epochs_lost=summary.resumed_from_epoch,
        time_to_recover_s=(back or float("nan")) - lost[0], models_exported=models,
        half_written=half, trainer_launches=op.starts, mpijobs=jobs, create_requests=posts,
        said=next((line for _, line in lines if line.startswith("reattached")), None),
    )  # fmt: skip


def _serve_one(op: Any) -> None:
    """The operator's script: serve the next MPIJob created."""
    op.serve(op.wait_for_job())


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
    from components.train.launcher.cluster.job import ClusterJobCancelled

    sent: list[float] = []

    def script(op: Any) -> None:
        name = op.wait_for_job()
        threading.Thread(target=_sigterm_mid_epoch, args=(op, sent), daemon=True).start()
        op.serve(name)

    op.play(script)
    gone_at = None
    with contextlib.suppress(ClusterJobCancelled):
        _run_mpijob(cluster, p, lambda _: None)
    if sent:
        gone_at = time.monotonic()
    op.join()
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
    from standins.kmock_cluster import Cluster, TrainerOperator

    bucket = b.bucket()
    previous = signal.signal(signal.SIGTERM, lambda *_: None)  # a late SIGTERM stops nothing
    try:
        with gcs_host(b.emulator), Cluster() as cluster:
            p = _mpijob_params(b, bucket, f"cancel-{b.trial}")
            op = TrainerOperator(cluster, b.env(**emulator_env(b.emulator)))
            cancelled = _cancel_once(b, cluster, op, p)
            progress = progress_at(op.lines, op.killed_at or cancelled["sent"])
            op.play(_serve_one)
            summary = _run_mpijob(cluster, p, lambda _: None)
            op.join(JOB_TIMEOUT_S)
            models, half = models_exported(p.train.output), half_written(bucket)
    finally:
        signal.signal(signal.SIGTERM, previous)
    nothing_left = cancelled["ranks_killed"] > 0 and not any(cancelled["left"].values())
    return record(
        "cancel", b.trial, nothing_left and op.starts == 2,
        epochs_lost=progress - summary.resumed_from_epoch,
        time_to_recover_s=cancelled["cleanup_s"], models_exported=models, half_written=half,
        left_after_cancel=cancelled["left"], ranks_killed=cancelled["ranks_killed"],
        rerun_resumed_from_epoch=summary.resumed_from_epoch,
    )  # fmt: skip
