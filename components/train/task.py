"""The train component's program: run the job on the chosen backend, return its outputs.

- ``local``: ``horovodrun -np workers`` inside the component's own container (or machine).
- ``mpijob``: a Kubeflow MPIJob across pods; the trainer reads and writes GCS directly.

Either way the component ends with one SavedModel at the Model artifact, the run summary and
the coordination report.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from components.common import storage
from components.common.params import check_parameters
from components.train.config import TrainConfig
from components.train.launch import run_local
from components.train.preflight import check_model_before_launch
from components.train.report import coordination_report

# The train step's inputs that are `TrainConfig` fields under the same name (the step's
# `architecture` is the field `model`: the step's output artifact already holds that name).
TRAIN_PARAMETERS = (
    "workers", "slots_per_worker", "epochs", "batch_size_per_worker", "learning_rate",
    "warmup_epochs", "threads_per_worker", "augment", "min_workers", "gpus_per_worker",
)  # fmt: skip

SERVICE_ACCOUNT_NAMESPACE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"


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
    config: TrainConfig, dataset_path: str, model_path: str, log: Callable[[str], None]
) -> dict[str, Any]:
    """Run ``horovodrun -np workers`` here on the artifacts' local paths; return the summary.

    One machine is the one worker host, so the world size is `config.workers`.
    """
    config = dataclasses.replace(
        config,
        data=dataset_path,
        output=work_uri(model_path),
        model_dir=model_path,
        slots_per_worker=1,
    )
    code = run_local(config, log=log)
    if code != 0:
        raise RuntimeError(
            f"the Horovod job failed (horovodrun exit code {code}); the rank-tagged log above "
            "says why. No model was exported."
        )
    return dict(json.loads(storage.read_text(config.summary_uri)))


def train_on_mpijob(
    config: TrainConfig, pods: dict[str, Any], namespace: str, log: Callable[[str], None]
) -> dict[str, Any]:
    """Run the trainer as an MPIJob; return its checked run summary.

    `pods` holds `MPIJobParams`' pod and run-policy fields by name.
    """
    from components.train.mpijob.lifecycle import run_mpijob
    from components.train.mpijob.manifest import MPIJobParams, uri_problems

    problems = uri_problems(config.data, config.output, config.model_dir)
    if problems:
        raise ValueError(
            "training_backend='mpijob' needs gs:// artifacts: set the pipeline root to a gs:// "
            "bucket (" + "; ".join(problems) + ")"
        )
    namespace = namespace or current_namespace()
    if not namespace:
        raise ValueError("namespace is empty and this pod's namespace is unknown: pass namespace")
    check_model_before_launch(config.model)  # this pod runs the trainer's image, as the ranks do
    params = MPIJobParams(train=config, owner_pod_name=os.environ.get("HOSTNAME") or None, **pods)
    return run_mpijob(params, namespace=namespace, log=log)


def run_train_task(
    config: TrainConfig,
    backend: str,
    dataset_path: str,
    model_path: str,
    outputs: tuple[str, str],
    pods: dict[str, Any] | None = None,
    namespace: str = "",
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Train on the chosen backend; write the run summary and coordination report files.

    `config` names the artifacts by URI (what the MPIJob's pods read and write); the local
    backend uses their local paths `dataset_path` and `model_path` instead. `outputs` are the
    paths of the run summary and the coordination report.
    """
    check_parameters({"training_backend": backend})
    if backend == "mpijob":
        summary = train_on_mpijob(config, pods or {}, namespace, log)
    else:
        summary = train_locally(config, dataset_path, model_path, log)
        summary["model_uri"] = config.model_uri  # the artifact's URI, as the pipeline sees it
    summary_path, report_path = outputs
    _write(summary_path, json.dumps(summary, indent=2, sort_keys=True))
    _write(report_path, coordination_report(summary))
    return summary


def artifact_metadata(summary: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The metadata of the Model and the run_summary artifacts, from the run summary."""
    model_keys = ("model", "augment", "world_size", "saved_model_sha256", "final_metrics")
    model = {"framework": "tensorflow-savedmodel", **{k: summary[k] for k in model_keys}}
    run = {k: summary[k] for k in ("world_size", "weights_identical_across_ranks")}
    return model, run


def _write(path: str, text: str) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(text)
