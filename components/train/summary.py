"""The run summary: what one Horovod job did, as a typed record, written and read here only.

``run_summary.json`` is the JSON of a `RunSummary` (TypedDicts: plain JSON, and each key and
its type checked by mypy wherever it is read). Rank 0 writes it (`write`); the train step, the
MPIJob's run check, the reports, the registry and the benchmarks read it (`read`, `parse`).
"""

from __future__ import annotations

import json
from typing import Any, TypedDict, cast

from components.common import storage

KIND = "kfp-horovod/run-summary/v1"


class DatasetRecord(TypedDict):
    uri: str
    manifest_sha256: str
    train_samples: int


class RankRecord(TypedDict, total=False):
    rank: int
    local_rank: int
    host: str
    device: str
    gpu_name: str  # GPU ranks only
    gpu_peak_memory_bytes: int  # GPU ranks only
    threads: int
    sample_range: list[int]
    samples_per_epoch: int
    steps_per_epoch: int
    examples_per_second: float
    weights_sha256: str


class Coverage(TypedDict, total=False):
    samples: int
    seen_per_epoch: int
    disjoint: bool
    covers_all: bool
    epochs_checked: int  # elastic jobs: every epoch, each at its world size


class RankUse(TypedDict):
    rank: int
    host: str
    step_ms: float
    compute_ms: float
    allreduce_ms: float
    cpu_cores_busy: float
    threads: int


class Straggler(TypedDict):
    rank: int
    host: str
    slower_by: float


class ResourceUse(TypedDict):
    """Did the workers pay (`components.train.resources`)."""

    step_seconds: float
    compute_share: float
    communication_share: float
    waiting_share: float
    estimated_efficiency: float
    epochs_measured: int
    per_rank: list[RankUse]
    straggler: Straggler | None
    advice: list[str]


class WorldEntry(TypedDict):
    epoch: int
    world_size: int
    when: str
    why: str


class ElasticRecord(TypedDict):
    """An elastic job's world sizes and every epoch's coverage (`components.train.elastic`)."""

    min_workers: int
    max_workers: int
    world_size_history: list[WorldEntry]
    epochs: list[dict[str, Any]]


class RunSummary(TypedDict, total=False):
    kind: str
    world_size: int
    expected_workers: int
    hosts: list[str]
    controller: str  # mpi (mpirun) or gloo (horovodrun)
    gradient_allreduce: str  # nccl or host
    epochs: int
    resumed_from_epoch: int
    batch_size_per_worker: int
    global_batch_size: int
    base_learning_rate: float
    learning_rate: float
    lr_scaling: str
    adam: dict[str, float]
    warmup_epochs: int
    model: str
    augment: bool
    model_parameters: int
    dataset: DatasetRecord
    per_rank: list[RankRecord]
    coverage: Coverage
    weights_identical_across_ranks: bool
    final_metrics: dict[str, float]
    checkpoint_uri: str
    tensorboard_uri: str
    model_uri: str
    saved_model_sha256: str
    models_exported: int
    exported_by_rank: int
    resource_use: ResourceUse | None
    elastic: ElasticRecord
    # the train step's: the backend it ran on and why (``training_backend``)
    training_backend: str
    training_backend_reason: str


def to_json(summary: RunSummary) -> str:
    return json.dumps(summary, indent=2, sort_keys=True)


def parse(text: str) -> RunSummary:
    """A run summary from its JSON (ValueError if it is not one)."""
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise ValueError(f"not valid JSON ({exc})") from exc
    if not isinstance(data, dict):
        raise ValueError("not a kfp-horovod run summary (expected a JSON object)")
    if "world_size" not in data:
        raise ValueError("not a kfp-horovod run summary (no world_size)")
    return cast(RunSummary, data)


def read(uri: str) -> RunSummary:
    """The run summary at `uri` (local path or ``gs://``); a ValueError names the URI and
    what is wrong with it."""
    try:
        text = storage.read_text(uri)
    except FileNotFoundError as exc:
        raise ValueError(f"run summary {uri}: missing") from exc
    except IsADirectoryError as exc:
        raise ValueError(f"run summary {uri}: is a directory, expected a JSON file") from exc
    try:
        return parse(text)
    except ValueError as exc:  # json.JSONDecodeError is a ValueError
        raise ValueError(f"run summary {uri}: {exc}") from exc


def write(uri: str, summary: RunSummary) -> None:
    storage.write_text(uri, to_json(summary))
