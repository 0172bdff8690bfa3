"""One cluster run of the trainer: its validated parameters, its name and its labels.

`ClusterJobParams` is what both cluster backends build their manifests from (the MPIJob of
mpi-operator, the TrainJob of Kubeflow Trainer): the trainer's `TrainConfig` plus the pods' and
run policy's fields. Nothing here talks to a cluster or reads the environment.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field

from components.common import defaults, storage
from components.common.declare import Declared, declared, field_problems, param
from components.common.placement import (
    NODE_SELECTOR_HELP,
    TOLERATIONS_HELP,
    node_selector_problem,
    parse_node_selector,
    tolerations_problem,
)
from components.train.cluster.podconfig import PodConfig, env_conflicts, node_selector_conflicts
from components.train.config import TrainConfig

# Labels. KFP v2 itself labels task pods with ``pipeline/runid``; we reuse the key.
LABEL_RUN_ID = "pipeline/runid"
LABEL_RUN_NAME = "kfp-horovod/run-name"
ANNOTATION_RUN_NAME = "kfp-horovod/run-name"
ANNOTATION_RUN_ID = "kfp-horovod/pipeline-run-id"

# The job's pods are named after it (mpi-operator: `<name>-launcher-xxxxx`, `<name>-worker-<i>`;
# JobSet: `<name>-launcher-0-0-xxxxx`, `<name>-node-0-<i>-xxxxx`), and a pod's hostname must be
# a DNS label (63 chars), so the job name leaves room for those suffixes.
MAX_NAME_LENGTH = 40
_DNS_1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?$")
_DNS_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")


def dns_name_problem(value: str | None) -> str | None:
    """Why `value` is not a lower-case DNS name (None: not set), or None."""
    if value is None or _DNS_NAME.match(value):
        return None
    return f"must be a lower-case DNS name, got {value!r}"


@dataclass(frozen=True)
class ClusterJobParams:
    """One cluster run of the trainer: its `TrainConfig` plus the pods' and run policy's fields.

    The trainer's URIs (`train.data`, `train.output`, `train.model_dir`) must be ``gs://``: the
    job's pods are not the component's pod and cannot see its disk, so the trainer reads the
    dataset and writes the model to GCS itself. The job has `train.workers` worker pods (the
    TrainJob's nodes) of `train.slots_per_worker` ranks each. The fields are declared
    (`param`): the render commands' options come from them. `task_config` is what the train
    task's KFP task config passes through to the pods (`components.train.cluster.podconfig`).
    """

    train: TrainConfig
    run_name: str = param(help="names the job")
    pipeline_run_id: str = param("", "the KFP run id (a label, and part of the name)")
    image: str = param(defaults.image_ref("trainer"), "the trainer image")
    stall_shutdown_seconds: int = param(
        defaults.STALL_SHUTDOWN_SECONDS, "how long a rank may stall (or stay silent) before "
        "the job ends", minimum=1,
    )  # fmt: skip
    # resources of each worker pod (requests == limits: Guaranteed QoS)
    cpu_per_worker: str = param(defaults.WORKER_CPU, "CPU of each worker pod", quantity=True)
    memory_per_worker: str = param(
        defaults.WORKER_MEMORY, "memory of each worker pod", quantity=True
    )
    launcher_cpu: str = param(
        defaults.LAUNCHER_CPU, "CPU of the launcher pod (MPIJob only)", quantity=True
    )
    launcher_memory: str = param(
        defaults.LAUNCHER_MEMORY, "memory of the launcher pod (MPIJob only)", quantity=True
    )
    # run policy
    ttl_seconds_after_finished: int = param(
        defaults.JOB_TTL_SECONDS_AFTER_FINISHED, "seconds a finished job is kept", minimum=0
    )
    backoff_limit: int = param(defaults.JOB_BACKOFF_LIMIT, "launcher retries", minimum=0)
    active_deadline_seconds: int = param(
        defaults.JOB_ACTIVE_DEADLINE_SECONDS, "the job's deadline", minimum=1
    )
    # gang scheduling (Volcano / scheduler-plugins); all optional
    queue: str | None = param(
        None, "gang-scheduling queue (Volcano; MPIJob only)", check=dns_name_problem
    )
    priority_class: str | None = param(None, "priority class of the pods", check=dns_name_problem)
    min_available: int | None = param(None, "gang size (MPIJob only; default: all pods)", minimum=1)
    scheduler_name: str | None = param(None, "e.g. volcano", check=dns_name_problem)
    # placement of every pod that runs a rank (and of the MPIJob's launcher)
    node_selector: str = param("{}", NODE_SELECTOR_HELP, check=node_selector_problem)
    tolerations: str = param("[]", TOLERATIONS_HELP, check=tolerations_problem)
    # identity and ownership
    service_account: str | None = param(
        None, "service account of the pods (Workload Identity)", check=dns_name_problem
    )
    owner_pod_name: str | None = param(None, "the pod that owns the job", check=dns_name_problem)
    owner_pod_uid: str | None = param(None, "its uid")
    task_config: PodConfig = field(default_factory=PodConfig)

    def __post_init__(self) -> None:
        problems = param_problems(self)
        if problems:
            raise ValueError("invalid cluster job parameters: " + "; ".join(problems))


CLUSTER_JOB_PARAMETERS: list[Declared] = declared(ClusterJobParams)


def uri_problems(data: str, output: str, model_dir: str | None) -> list[str]:
    """The trainer's URIs that are not ``gs://`` (a cluster job's pods cannot see local disk)."""
    return [
        f"{name} must be a gs:// URI for a cluster backend (its pods cannot see the "
        f"component's disk), got {uri!r}"
        for name, uri in (
            ("data", data), ("output", output), ("model_dir", model_dir)
        )
        if uri is not None and not storage.is_gcs(uri)
    ]  # fmt: skip


def param_problems(p: ClusterJobParams) -> list[str]:
    """Every problem with `p`, each naming the parameter; empty if it is valid (the trainer's
    own fields were checked when `p.train` was made)."""
    problems = [] if p.run_name.strip() else ["run_name is empty"]
    problems += uri_problems(p.train.data, p.train.output, p.train.model_dir)
    if not p.image or any(c.isspace() for c in p.image):
        problems.append(f"image must be a non-empty image reference, got {p.image!r}")
    values = {f.name: getattr(p, f.name) for f in CLUSTER_JOB_PARAMETERS}
    problems += field_problems(CLUSTER_JOB_PARAMETERS, values)
    if p.min_available is not None and p.min_available > p.train.workers + 1:
        problems.append(
            f"min_available must be <= workers + 1 launcher = {p.train.workers + 1}, "
            f"got {p.min_available}"
        )
    if p.owner_pod_uid and not p.owner_pod_name:
        problems.append("owner_pod_uid is set but owner_pod_name is not")
    if not node_selector_problem(p.node_selector):
        selector = parse_node_selector(p.node_selector)
        problems += node_selector_conflicts(selector, p.task_config.node_selector)
    problems += env_conflicts(p.task_config.env)
    return problems


def sanitize_name(text: str, max_length: int = MAX_NAME_LENGTH) -> str:
    """Lower-case `text` into a DNS-1035 label (letters, digits, '-'; starts with a letter).

    Returns ``""`` when nothing usable is left; the caller adds a prefix.
    """
    slug = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")
    slug = re.sub(r"^[^a-z]+", "", slug)  # must start with a letter
    return slug[:max_length].rstrip("-")


def job_name(run_name: str, pipeline_run_id: str = "") -> str:
    """The job's name: ``hvd-<run name slug>-<hash>``, a DNS-1035 label of <= 40 chars.

    Deterministic, so a retried KFP task finds the job its first attempt created; the hash of
    the full run name and run id keeps runs whose slugs collide apart.
    """
    digest = hashlib.sha256(f"{pipeline_run_id}\0{run_name}".encode()).hexdigest()[:8]
    prefix = defaults.JOB_NAME_PREFIX
    room = MAX_NAME_LENGTH - len(prefix) - len(digest) - 2
    slug = sanitize_name(run_name, room)
    name = f"{prefix}-{slug}-{digest}" if slug else f"{prefix}-{digest}"
    assert _DNS_1035.match(name) and len(name) <= MAX_NAME_LENGTH, name
    return name


def label_value(text: str) -> str:
    """`text` made into a valid label value (<= 63 chars of [A-Za-z0-9_.-], alnum at the ends)."""
    value = re.sub(r"[^A-Za-z0-9_.-]+", "-", text)[:63]
    value = re.sub(r"^[^A-Za-z0-9]+|[^A-Za-z0-9]+$", "", value)
    assert _LABEL_VALUE.match(value), value
    return value


APP_LABELS = {
    "app.kubernetes.io/name": "kfp-horovod",
    "app.kubernetes.io/component": "trainer",
    "app.kubernetes.io/managed-by": "kfp-horovod",
}


def run_labels(p: ClusterJobParams) -> dict[str, str]:
    """The labels of the job and its pods: the app's, the run name's and the KFP run id's."""
    labels = {**APP_LABELS, LABEL_RUN_NAME: label_value(p.run_name) or "run"}
    if p.pipeline_run_id:
        labels[LABEL_RUN_ID] = label_value(p.pipeline_run_id)
    return labels


def job_metadata(p: ClusterJobParams, namespace: str | None) -> dict[str, object]:
    """The job's metadata: its name, labels, the run's annotations and the owner reference."""
    metadata: dict[str, object] = {
        "name": job_name(p.run_name, p.pipeline_run_id),
        "labels": run_labels(p),
        "annotations": {ANNOTATION_RUN_NAME: p.run_name, ANNOTATION_RUN_ID: p.pipeline_run_id},
    }
    if namespace:
        metadata["namespace"] = namespace
    if p.owner_pod_name and p.owner_pod_uid:
        metadata["ownerReferences"] = [owner_reference(p.owner_pod_name, p.owner_pod_uid)]
    return metadata


def owner_reference(pod_name: str, pod_uid: str) -> dict[str, object]:
    """An owner reference to the component's pod: the job is garbage-collected with it."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "name": pod_name,
        "uid": pod_uid,
        "controller": False,
        "blockOwnerDeletion": False,
    }
