"""The train component's program: run the job on the chosen backend, return its outputs.

- ``local``: ``horovodrun -np workers`` inside the component's own container (or machine).
- ``mpijob``: a Kubeflow MPIJob across pods; the trainer reads and writes GCS directly.

Either way the component ends with one SavedModel at the Model artifact, the run summary and
the coordination report.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from components.common import storage
from components.common.params import TRAINING_BACKENDS
from components.train.config import TrainConfig
from components.train.launch import run_local
from components.train.report import coordination_report

SERVICE_ACCOUNT_NAMESPACE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"


@dataclass(frozen=True)
class TrainSettings:
    """The train component's parameters (pipeline parameters, checked before any work)."""

    workers: int
    epochs: int
    batch_size_per_worker: int
    learning_rate: float
    warmup_epochs: int
    threads_per_worker: int = 0  # 0: cores / local workers
    backend: str = "local"
    # MPIJob backend only
    trainer_image: str = ""
    slots_per_worker: int = 1
    cpu_per_worker: str = "2"
    memory_per_worker: str = "4Gi"
    gpus_per_worker: int = 0
    namespace: str = ""
    service_account: str = ""
    run_name: str = "kfp-horovod"
    pipeline_run_id: str = ""

    def __post_init__(self) -> None:
        if self.backend not in TRAINING_BACKENDS:
            raise ValueError(
                f"training_backend must be one of {', '.join(TRAINING_BACKENDS)}, "
                f"got {self.backend!r}"
            )


def work_uri(model_uri: str) -> str:
    """Where the trainer keeps its run summary and checkpoints: beside the Model artifact."""
    return storage.join(model_uri.rstrip("/").rsplit("/", 1)[0], "train-work")


def current_namespace() -> str:
    """The namespace of this pod (from its service account), or '' outside Kubernetes."""
    try:
        return Path(SERVICE_ACCOUNT_NAMESPACE).read_text().strip()
    except OSError:
        return ""


def train_locally(
    settings: TrainSettings, data: str, model_dir: str, log: Callable[[str], None]
) -> dict[str, Any]:
    """Run ``horovodrun -np workers`` here; return the run summary."""
    output = work_uri(model_dir)
    config = TrainConfig(
        data=data,
        output=output,
        model_dir=model_dir,
        expected_workers=settings.workers,
        epochs=settings.epochs,
        batch_size_per_worker=settings.batch_size_per_worker,
        base_learning_rate=settings.learning_rate,
        warmup_epochs=settings.warmup_epochs,
        threads_per_worker=settings.threads_per_worker or None,
    )
    code = run_local(config, log=log)
    if code != 0:
        raise RuntimeError(
            f"the Horovod job failed (horovodrun exit code {code}); the rank-tagged log above "
            "says why. No model was exported."
        )
    return dict(json.loads(storage.read_text(config.summary_uri)))


def train_on_mpijob(
    settings: TrainSettings, data_uri: str, model_uri: str, log: Callable[[str], None]
) -> dict[str, Any]:
    """Run the trainer as an MPIJob; return its checked run summary."""
    from components.train.mpijob.lifecycle import run_mpijob
    from components.train.mpijob.manifest import MPIJobParams

    for name, uri in (("dataset", data_uri), ("model", model_uri)):
        if not storage.is_gcs(uri):
            raise ValueError(
                f"the {name} artifact is at {uri!r}, but training_backend='mpijob' needs gs:// "
                "artifacts (the MPIJob's pods cannot see this pod's disk): set the pipeline "
                "root to a gs:// bucket"
            )
    namespace = settings.namespace or current_namespace()
    if not namespace:
        raise ValueError("namespace is empty and this pod's namespace is unknown: pass namespace")
    params = MPIJobParams(
        run_name=settings.run_name,
        pipeline_run_id=settings.pipeline_run_id,
        data_uri=data_uri,
        output_uri=work_uri(model_uri),
        model_uri=model_uri,
        image=settings.trainer_image,
        workers=settings.workers,
        slots_per_worker=settings.slots_per_worker,
        epochs=settings.epochs,
        batch_size=settings.batch_size_per_worker,
        learning_rate=settings.learning_rate,
        warmup_epochs=settings.warmup_epochs,
        threads_per_worker=settings.threads_per_worker or None,
        cpu_per_worker=settings.cpu_per_worker,
        memory_per_worker=settings.memory_per_worker,
        gpus_per_worker=settings.gpus_per_worker,
        service_account=settings.service_account or None,
        owner_pod_name=os.environ.get("HOSTNAME") or None,
    )
    return run_mpijob(params, namespace=namespace, log=log)


def run_train_task(
    settings: TrainSettings,
    dataset: tuple[str, str],
    model: tuple[str, str],
    summary_path: str,
    report_path: str,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Train on the chosen backend; write the run summary and coordination report files.

    `dataset` and `model` are ``(local path, URI)`` pairs as KFP gives them.
    """
    if settings.backend == "mpijob":
        summary = train_on_mpijob(settings, dataset[1], model[1], log)
    else:
        summary = train_locally(settings, dataset[0], model[0], log)
        summary["model_uri"] = model[1]  # the artifact's URI, as the rest of the pipeline sees it
    Path(summary_path).parent.mkdir(parents=True, exist_ok=True)
    Path(summary_path).write_text(json.dumps(summary, indent=2, sort_keys=True))
    Path(report_path).parent.mkdir(parents=True, exist_ok=True)
    Path(report_path).write_text(coordination_report(summary))
    return summary
