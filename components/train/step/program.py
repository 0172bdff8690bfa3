"""The train component's program, in the train step's pod: run the job on the chosen backend
(``auto``: the MPIJob or the TrainJob, whichever the cluster serves; ``local``: mpirun in this
pod; ``mpijob``; ``trainjob``), and end with one SavedModel, the run summary and the report.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from components.common import storage
from components.common.defaults import GPU_RESOURCE
from components.common.failure import InputError
from components.train import summary
from components.train.config import TrainConfig
from components.train.launcher.cluster import job
from components.train.launcher.cluster.job import Choice, PodConfig
from components.train.launcher.launch import run_local_job
from components.train.launcher.parameters import TrainStep
from components.train.launcher.preflight import check_job_before_launch
from components.train.summary import RunSummary, coordination_report

Log = Callable[[str], None]
# The task config's fields that KFP passes to the step without applying them to its own pod
# (`components.train.step.component.PASSTHROUGHS`).
PLACEMENT_ONLY = ("node_selector", "tolerations", "affinity", "volumes")
FORCED = "training_backend forces it"
SERVICE_ACCOUNT_NAMESPACE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"


def work_uri(model_uri: str) -> str:
    """Where the trainer keeps its run summary and checkpoints: beside the Model artifact."""
    return storage.join(model_uri.rstrip("/").rsplit("/", 1)[0], "train-work")


def train_locally(config: TrainConfig, dataset_path: str, model_path: str, log: Log) -> RunSummary:
    """Run ``mpirun -np workers`` here on the artifacts' local paths (one host, one slot each)."""
    config = dataclasses.replace(
        config,
        data=dataset_path,
        output=work_uri(model_path),
        model_dir=model_path,
        slots_per_worker=1,
    )
    run_local_job(config, log=log)  # raises, naming why, if the job fails
    return summary.read(config.summary_uri)


def pod_config(task_config: Any) -> PodConfig:
    """The `PodConfig` of a ``kfp.dsl.TaskConfig`` (None: nothing passed through); InputError
    naming a bad node selector or toleration in it."""
    passed = {f.name: getattr(task_config, f.name, None) for f in dataclasses.fields(PodConfig)}
    return PodConfig(**{name: value for name, value in passed.items() if value})


def worker_resources(resources: Mapping[str, Any] | None, step: TrainStep, gpus: int) -> TrainStep:
    """`step` with its workers' CPU and memory from the task config's `resources` (a limit,
    else a request) where its parameters are at their defaults; a parameter set otherwise, and
    `gpus`, must agree (ValueError names each disagreement)."""

    def amount(name: str) -> str | None:
        for part in ("limits", "requests"):
            value = ((resources or {}).get(part) or {}).get(name)
            if value not in (None, ""):
                return str(value)
        return None

    chosen: dict[str, Any] = {}
    problems: list[str] = []
    for name, parameter in (("cpu", "cpu_per_worker"), ("memory", "memory_per_worker")):
        passed, value = amount(name), getattr(step, parameter)
        if passed is None or passed == str(value):
            continue
        if value != TrainStep.__dataclass_fields__[parameter].default:
            problems.append(
                f"{name}: the {parameter} parameter says {value!r}, the train task's config "
                f"says {passed!r}"
            )
        else:
            chosen[parameter] = passed
    passed_gpus = amount(GPU_RESOURCE)
    if passed_gpus not in (None, "0") and passed_gpus != str(gpus):
        problems.append(
            f"{GPU_RESOURCE}: the gpus_per_worker parameter says {gpus!r}, the train task's "
            f"config says {passed_gpus!r}"
        )
    if problems:
        raise InputError(
            "the train task's config and the pipeline's parameters disagree: " + "; ".join(problems)
        )
    return dataclasses.replace(step, **chosen)


def train_on_cluster(
    config: TrainConfig, step: TrainStep, pipeline_run_id: str, log: Log, task_config: Any = None
) -> tuple[RunSummary, Choice]:
    """Run the trainer as an MPIJob or a TrainJob (``auto``: the one the cluster serves, said
    first), with what the train task's KFP task config passes through on its pods; return its
    run summary and backend."""
    from kubernetes import client

    from components.train.launcher.cluster.run import default_api_client, run_job

    api_client = None
    chosen = Choice(step.training_backend, FORCED)
    if step.training_backend == "auto":
        api_client = default_api_client()
        chosen = job.choose_backend(client.CustomObjectsApi(api_client))
        log(f"training_backend=auto chose {chosen.backend}: {chosen.reason}")
    resources = getattr(task_config, "resources", None)
    params = job.ClusterJobParams(  # refuses artifacts that are not gs://, among others
        train=config,
        step=worker_resources(resources, step, config.gpus_per_worker),
        run_name=f"train-{pipeline_run_id}" if pipeline_run_id else "train",
        pipeline_run_id=pipeline_run_id,
        owner_pod_name=os.environ.get("HOSTNAME") or None,
        task_config=pod_config(task_config),
    )
    namespace = step.namespace
    with contextlib.suppress(OSError):  # this pod's (from its service account), if it has one
        namespace = namespace or Path(SERVICE_ACCOUNT_NAMESPACE).read_text().strip()
    if not namespace:
        raise InputError("namespace is empty and this pod's namespace is unknown: pass namespace")
    check_job_before_launch(config)  # this pod runs the trainer's image, as the ranks do
    b = job.job_kind(chosen.backend)
    record = run_job(b, params, namespace=namespace, api_client=api_client, log=log)
    return record, chosen


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
    """Train on `step`'s backend; write the run summary and coordination report to `outputs`.
    `config` names the artifacts by URI (what a cluster job's pods read and write); the local
    backend uses their local paths `dataset_path` and `model_path` instead."""
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
        backend = Choice("local", FORCED)
        # the artifacts' URIs, as the pipeline sees them (the ranks wrote to their local paths)
        record.config = dataclasses.replace(
            record.config, output=config.output, model_dir=config.model_dir
        )
    record.training_backend = backend.backend
    record.training_backend_reason = backend.reason
    summary_path, report_path = outputs
    storage.write_text(summary_path, summary.to_json(record))
    storage.write_text(report_path, coordination_report(record))
    return record


def train_step(
    dataset: Any,
    saved_model: Any,
    run_summary: Any,
    coordination_report: Any,
    pipeline_run_id: str,
    task_config: Any = None,
    **values: Any,
) -> None:
    """The train step on its KFP artifacts: `values` are its declared parameters, by name;
    `task_config` the train task's ``dsl.TaskConfig``, which KFP's driver fills in."""
    trainer = {p.name: values.pop(p.name) for p in TrainConfig.parameters(pipeline_only=True)}
    config = TrainConfig(
        data=dataset.uri, output=work_uri(saved_model.uri), model_dir=saved_model.uri, **trainer
    )
    record = run_train_task(
        config,
        TrainStep(**values),
        dataset.path,
        saved_model.path,
        (run_summary.path, coordination_report.path),
        pipeline_run_id,
        task_config=task_config,
    )
    model_metadata, summary_metadata = artifact_metadata(record)
    saved_model.metadata.update(model_metadata)
    run_summary.metadata.update(summary_metadata)


def artifact_metadata(record: RunSummary) -> tuple[dict[str, Any], dict[str, Any]]:
    """The metadata of the Model and the run_summary artifacts, from the run summary."""
    model = {
        "framework": "tensorflow-savedmodel",
        "model": record.config.model,
        "augment": record.config.augment,
        "world_size": record.world_size,
        "epochs": record.config.epochs,
        "saved_model_sha256": record.saved_model_sha256,
        "final_metrics": record.final_metrics,
        "tensorboard_uri": record.config.tensorboard_uri,
    }
    run = {
        "world_size": record.world_size,
        "weights_identical_across_ranks": record.weights_identical_across_ranks,
        "training_backend": record.training_backend,
    }
    return model, run
