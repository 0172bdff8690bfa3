"""The export room: every rank shares what it did; rank 0 writes the one SavedModel and the
run summary, and says in plain words whether it was one model or N.
"""

from __future__ import annotations

import socket
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from components.common import dataset, storage
from components.train.config import TrainConfig
from components.train.data import Shard, coverage
from components.train.devices import gpu_usage
from components.train.fit import EpochStats
from components.train.job import EXIT_OK, Job, Trainee, controller
from components.train.model import count_parameters, weights_fingerprint
from components.train.report import device_text, world_history
from components.train.resources import resource_use
from components.train.summary import KIND, RankRecord, RunSummary, write


def gather_and_export(
    job: Job,
    trainee: Trainee,
    shard: Shard,
    final_metrics: dict[str, float],
    stats: EpochStats,
    epoch_ids: np.ndarray,
    extra: RunSummary | None = None,
) -> int:
    """Every rank shares what it did; rank 0 exports the one model and the run summary (with
    `extra`'s keys added)."""
    from horovod.tensorflow import allgather_object

    mine: RankRecord = {
        "rank": job.rank,
        "local_rank": job.hvd.local_rank(),
        "host": socket.gethostname(),
        "device": job.device,
        **gpu_usage(job.tf, job.devices),  # type: ignore[typeddict-item]
        "threads": job.threads,
        "sample_range": [shard.start, shard.stop],
        "samples_per_epoch": int(len(shard.labels)),
        "steps_per_epoch": shard.steps,
        "examples_per_second": stats.examples_per_second(),
        "weights_sha256": weights_fingerprint(trainee.model),
    }
    per_rank = allgather_object(mine)
    all_ids = allgather_object(epoch_ids)
    if job.rank != 0:
        return EXIT_OK
    summary = _summarise(
        job.config, job.size, shard, job.scaled_lr, trainee.initial_epoch, final_metrics,
        per_rank, all_ids,
    )  # fmt: skip
    summary["controller"] = controller(job.hvd)
    summary["gradient_allreduce"] = job.gradient_allreduce
    hosts = {r["rank"]: r["host"] for r in per_rank}
    summary["resource_use"] = resource_use(stats.costs, hosts) if stats.costs else None
    summary["adam"] = asdict(job.adam)
    summary["model_parameters"] = count_parameters(trainee.model)
    summary.update(extra or {})
    summary["model_uri"] = job.config.model_uri
    summary["saved_model_sha256"] = _export(trainee.model, job.config.model_uri)
    write(job.config.summary_uri, summary)
    for line in coordination_lines(summary):
        job.log.info("%s", line)
    return EXIT_OK


def _summarise(
    config: TrainConfig,
    size: int,
    shard: Shard,
    scaled_lr: float,
    initial_epoch: int,
    final_metrics: dict[str, float],
    per_rank: list[RankRecord],
    all_ids: list[np.ndarray],
) -> RunSummary:
    fingerprints = {r["weights_sha256"] for r in per_rank}
    return {
        "kind": KIND,
        "world_size": size,
        "expected_workers": config.world_size,
        "hosts": sorted({r["host"] for r in per_rank}),
        "epochs": config.epochs,
        "resumed_from_epoch": initial_epoch,
        "batch_size_per_worker": config.batch_size_per_worker,
        "global_batch_size": config.batch_size_per_worker * size,
        "base_learning_rate": config.learning_rate,
        "learning_rate": scaled_lr,
        "lr_scaling": config.lr_scaling,
        "warmup_epochs": config.warmup_epochs,
        "model": config.model,
        "augment": config.augment,
        "dataset": {
            "uri": config.data,
            "manifest_sha256": shard.manifest_sha256,
            "train_samples": shard.total,
        },
        "per_rank": sorted(per_rank, key=lambda r: r["rank"]),
        "coverage": {"samples": shard.total, **coverage(all_ids, shard.total)},
        "weights_identical_across_ranks": len(fingerprints) == 1,
        "final_metrics": final_metrics,
        "checkpoint_uri": config.checkpoint_uri,
        "tensorboard_uri": config.tensorboard_uri,
        "models_exported": 1,
        "exported_by_rank": 0,
    }


def _export(model: Any, model_uri: str) -> str:
    """Rank 0 writes the one SavedModel (no optimizer: it loads without Horovod); the sha256 of
    its ``saved_model.pb``."""
    with tempfile.TemporaryDirectory(prefix="export-") as tmp:
        local = Path(tmp) / "model"
        model.save(str(local), include_optimizer=False, save_format="tf")
        pb_sha256 = dataset.sha256_bytes((local / "saved_model.pb").read_bytes())
        storage.upload_dir(local, model_uri, last="saved_model.pb")
    return pb_sha256


def coordination_lines(summary: RunSummary) -> list[str]:
    """The plain-words answer to 'one model or N?', for the log."""
    size = summary["world_size"]
    lines = [
        f"{size} workers formed ONE job ({summary['controller']} controller) and trained ONE "
        f"model (weights identical on all ranks: {summary['weights_identical_across_ranks']}); "
        f"gradient allreduce {summary['gradient_allreduce']}.",
        f"model {summary['model']} ({summary['model_parameters']:,} parameters), augmentation "
        f"{'on' if summary['augment'] else 'off'}",
    ]
    for r in summary["per_rank"]:
        lo, hi = r["sample_range"]
        lines.append(
            f"  rank {r['rank']} on {r['host']} ({device_text(r)}, {r['threads']} threads): "
            f"samples [{lo}, {hi}) = {r['samples_per_epoch']} per epoch, "
            f"{r['steps_per_epoch']} steps per epoch, {r['examples_per_second']} examples/s"
        )
    cov = summary["coverage"]
    lines.append(
        f"every epoch saw {cov['seen_per_epoch']} of {cov['samples']} samples "
        f"(disjoint: {cov['disjoint']}, all covered: {cov['covers_all']})"
    )
    history = world_history(summary)
    if history:
        lines.append(history)
    lines.append(f"1 model, exported by rank 0, at {summary['model_uri']}")
    return lines
