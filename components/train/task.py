"""The train component's program: run the job on the chosen backend, return its outputs.

- ``auto`` (the compiled default): the MPIJob or the TrainJob, whichever the cluster serves
  (`components.train.cluster.discovery`), said in the step's first line;
- ``local``: ``mpirun -np workers`` inside the component's own container (or machine).
- ``mpijob``: a Kubeflow MPIJob across pods (mpi-operator); the trainer reads and writes GCS
  directly.
- ``trainjob``: the same job as a Kubeflow Trainer v2 TrainJob, on the project's own
  TrainingRuntime.

Either way the component ends with one SavedModel at the Model artifact, the run summary and
the coordination report.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from components.common import defaults, storage
from components.train import summary
from components.train.config import PIPELINE_TRAIN_PARAMETERS, TrainConfig
from components.train.launch import run_local_job
from components.train.preflight import check_model_before_launch
from components.train.step import TrainStep
from components.train.summary import RunSummary, coordination_report

if TYPE_CHECKING:
    from components.train.cluster.params import ClusterJobParams

Log = Callable[[str], None]
# The task config's fields that KFP passes to the step without applying them to its own pod
# (`components.train.component.PASSTHROUGHS`).
PLACEMENT_ONLY = ("node_selector", "tolerations", "affinity", "volumes")
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


def train_locally(config: TrainConfig, dataset_path: str, model_path: str, log: Log) -> RunSummary:
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
    run_local_job(config, log=log)  # raises, naming why, if the job fails
    return summary.read(config.summary_uri)


@dataclass(frozen=True)
class Backend:
    """The backend a run used (``training_backend``'s choice) and why: recorded in the run
    summary and the coordination report under the same names."""

    training_backend: str
    reason: str


def choose(step: TrainStep, config: TrainConfig, api_client: Any, log: Log) -> Backend:
    """`step.training_backend`, or for ``auto`` what the cluster serves (said first)."""
    if step.training_backend != "auto":
        return Backend(step.training_backend, "training_backend forces it")
    from kubernetes import client

    from components.train.cluster.discovery import choose_backend

    choice = choose_backend(client.CustomObjectsApi(api_client), config.min_workers)
    log(choice.line)
    return Backend(choice.backend, choice.reason)


def cluster_params(
    config: TrainConfig, step: TrainStep, pipeline_run_id: str, task_config: Any
) -> ClusterJobParams:
    """The job's parameters: the trainer's and the step's, with what the train task's KFP task
    config passes through (`components.train.cluster.podconfig`); ValueError names each
    disagreement between the two."""
    from components.train.cluster.params import ClusterJobParams
    from components.train.cluster.podconfig import from_task_config, worker_resources

    sizes = {"cpu_per_worker": step.cpu_per_worker, "memory_per_worker": step.memory_per_worker}
    gpus = {"gpus_per_worker": config.gpus_per_worker}
    chosen, problems = worker_resources(
        getattr(task_config, "resources", None), sizes | gpus,
        {"cpu_per_worker": defaults.WORKER_CPU, "memory_per_worker": defaults.WORKER_MEMORY},
    )  # fmt: skip
    if problems:
        raise ValueError(
            "the train task's config and the pipeline's parameters disagree: " + "; ".join(problems)
        )
    return ClusterJobParams(
        train=config,
        run_name=f"train-{pipeline_run_id}" if pipeline_run_id else "train",
        pipeline_run_id=pipeline_run_id,
        image=defaults.trainer_image(config.gpus_per_worker, override=step.trainer_image),
        service_account=step.trainer_service_account or None,
        owner_pod_name=os.environ.get("HOSTNAME") or None,
        node_selector=step.node_selector, tolerations=step.tolerations,
        task_config=from_task_config(task_config),
        cpu_per_worker=chosen.get("cpu_per_worker", step.cpu_per_worker),
        memory_per_worker=chosen.get("memory_per_worker", step.memory_per_worker),
    )  # fmt: skip


def train_on_cluster(
    config: TrainConfig, step: TrainStep, pipeline_run_id: str, log: Log, task_config: Any = None
) -> tuple[RunSummary, Backend]:
    """Run the trainer as an MPIJob or a TrainJob (`step.training_backend`, ``auto``: the one
    the cluster serves, `choose`); return its checked run summary and the backend."""
    from components.train.cluster.lifecycle import default_api_client
    from components.train.cluster.params import uri_problems

    api_client = default_api_client() if step.training_backend == "auto" else None
    backend = choose(step, config, api_client, log)
    problems = uri_problems(config.data, config.output, config.model_dir)
    if problems:
        raise ValueError(
            f"training_backend={step.training_backend!r} needs gs:// artifacts: set the pipeline "
            "root to a gs:// bucket (" + "; ".join(problems) + ")"
        )
    namespace = step.namespace or current_namespace()
    if not namespace:
        raise ValueError("namespace is empty and this pod's namespace is unknown: pass namespace")
    check_model_before_launch(config.model)  # this pod runs the trainer's image, as the ranks do
    params = cluster_params(config, step, pipeline_run_id, task_config)
    if backend.training_backend == "trainjob":
        from components.train.trainjob.lifecycle import run_trainjob

        record = run_trainjob(params, namespace=namespace, api_client=api_client, log=log)
    else:
        from components.train.mpijob.lifecycle import run_mpijob

        record = run_mpijob(params, namespace=namespace, api_client=api_client, log=log)
    return record, backend


def run_train_task(
    config: TrainConfig,
    step: TrainStep,
    dataset_path: str,
    model_path: str,
    outputs: tuple[str, str],
    pipeline_run_id: str = "",
    log: Log = print,
    task_config: Any = None,
) -> RunSummary:
    """Train on `step`'s backend; write the run summary and coordination report files.

    `config` names the artifacts by URI (what the cluster job's pods read and write); the local
    backend uses their local paths `dataset_path` and `model_path` instead. `outputs` are the
    paths of the run summary and the coordination report. `task_config` is the train task's
    KFP task config (``dsl.TaskConfig``), forwarded to a cluster job's pods.
    """
    if step.training_backend != "local":
        record, backend = train_on_cluster(config, step, pipeline_run_id, log, task_config)
    else:
        if any(getattr(task_config, name, None) for name in PLACEMENT_ONLY):
            log(
                "WARNING: training_backend=local trains in this pod, which the train task's "
                "node selector, tolerations, affinity and volumes do not reach (KFP passes them "
                "to a cluster job's pods only)"
            )
        record = train_locally(config, dataset_path, model_path, log)
        backend = Backend("local", "training_backend forces it")
        # the artifacts' URIs, as the pipeline sees them (the ranks wrote to their local paths)
        record.config = dataclasses.replace(
            record.config, output=config.output, model_dir=config.model_dir
        )
    record.training_backend = backend.training_backend
    record.training_backend_reason = backend.reason
    summary_path, report_path = outputs
    _write(summary_path, summary.to_json(record))
    _write(report_path, coordination_report(record))
    return record


def run_step(
    dataset: Any,
    saved_model: Any,
    run_summary: Any,
    coordination_report: Any,
    pipeline_run_id: str,
    task_config: Any = None,
    **values: Any,
) -> None:
    """The train step (KFP artifacts `dataset`, `saved_model`, `run_summary`,
    `coordination_report`): `values` are its declared parameters, by name; `task_config` the
    train task's KFP task config (``dsl.TaskConfig``), which KFP's driver fills in."""
    trainer = {p.name: values.pop(p.name) for p in PIPELINE_TRAIN_PARAMETERS}
    config = TrainConfig(
        data=dataset.uri, output=work_uri(saved_model.uri), model_dir=saved_model.uri, **trainer
    )
    record = run_train_task(
        config, TrainStep(**values), dataset.path, saved_model.path,
        (run_summary.path, coordination_report.path), pipeline_run_id, task_config=task_config,
    )  # fmt: skip
    model_metadata, summary_metadata = artifact_metadata(record)
    saved_model.metadata.update(model_metadata)
    run_summary.metadata.update(summary_metadata)


def artifact_metadata(record: RunSummary) -> tuple[dict[str, Any], dict[str, Any]]:
    """The metadata of the Model and the run_summary artifacts, from the run summary."""
    model = {
        "framework": "tensorflow-savedmodel", "model": record.config.model,
        "augment": record.config.augment, "world_size": record.world_size,
        "epochs": record.config.epochs, "saved_model_sha256": record.saved_model_sha256,
        "final_metrics": record.final_metrics, "tensorboard_uri": record.config.tensorboard_uri,
    }  # fmt: skip
    run = {
        "world_size": record.world_size,
        "weights_identical_across_ranks": record.weights_identical_across_ranks,
        "training_backend": record.training_backend,
    }
    return model, run


def _write(path: str, text: str) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(text)
