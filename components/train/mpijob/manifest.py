"""The MPIJob manifest, built by a pure function from the pipeline parameters.

Nothing here talks to a cluster or reads the environment: `build_manifest` maps an
`MPIJobParams` to the ``kubeflow.org/v2beta1`` MPIJob dict that `lifecycle` submits and
``python -m pipeline render-mpijob`` prints.
"""

from __future__ import annotations

import hashlib
import re
import shlex
from dataclasses import dataclass
from typing import Any

from components.common import defaults, storage
from components.train.config import TrainConfig
from components.train.launch import trainer_args as cli_args

API_GROUP = "kubeflow.org"
API_VERSION = "v2beta1"
PLURAL = "mpijobs"
KIND = "MPIJob"

# Labels. KFP v2 itself labels task pods with ``pipeline/runid``; we reuse the key.
LABEL_RUN_ID = "pipeline/runid"
LABEL_RUN_NAME = "kfp-horovod/run-name"
LABEL_JOB = "kfp-horovod/mpijob"
LABEL_ROLE = "kfp-horovod/role"
ANNOTATION_RUN_NAME = "kfp-horovod/run-name"
ANNOTATION_RUN_ID = "kfp-horovod/pipeline-run-id"

# mpi-operator creates `<name>-launcher-xxxxx` and `<name>-worker-<i>` pods, and the worker's
# hostname must be a DNS label (63 chars), so the job name leaves room for those suffixes.
MAX_NAME_LENGTH = 40
_DNS_1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?$")
_QUANTITY = re.compile(r"^(\d+(\.\d+)?|\.\d+)(m|[KMGTPE]i?|[kMGTPE])?$")
_GPU_RESOURCE = "nvidia.com/gpu"


@dataclass(frozen=True)
class MPIJobParams:
    """Everything one MPIJob run of the trainer needs.

    URIs must be ``gs://``: the MPIJob's pods are not the component's pod and cannot see its
    disk, so the trainer reads the dataset and writes the model to GCS itself.
    `model_uri` defaults to ``<output_uri>/model`` (the trainer's own default).
    """

    run_name: str
    data_uri: str
    output_uri: str
    pipeline_run_id: str = ""
    image: str = defaults.image_ref("trainer")
    workers: int = defaults.WORKERS
    slots_per_worker: int = defaults.SLOTS_PER_WORKER
    model_uri: str | None = None
    # trainer arguments
    epochs: int = defaults.EPOCHS
    batch_size: int = defaults.BATCH_SIZE_PER_WORKER
    learning_rate: float = defaults.BASE_LEARNING_RATE
    warmup_epochs: int = defaults.WARMUP_EPOCHS
    threads_per_worker: int | None = None
    seed: int = defaults.SHUFFLE_SEED
    stall_shutdown_seconds: int = defaults.STALL_SHUTDOWN_SECONDS
    # resources of each worker pod (requests == limits: Guaranteed QoS)
    cpu_per_worker: str = defaults.WORKER_CPU
    memory_per_worker: str = defaults.WORKER_MEMORY
    gpus_per_worker: int = 0
    launcher_cpu: str = defaults.LAUNCHER_CPU
    launcher_memory: str = defaults.LAUNCHER_MEMORY
    # run policy
    ttl_seconds_after_finished: int = defaults.MPIJOB_TTL_SECONDS_AFTER_FINISHED
    backoff_limit: int = defaults.MPIJOB_BACKOFF_LIMIT
    active_deadline_seconds: int = defaults.MPIJOB_ACTIVE_DEADLINE_SECONDS
    # gang scheduling (Volcano / scheduler-plugins); all optional
    queue: str | None = None
    priority_class: str | None = None
    min_available: int | None = None
    scheduler_name: str | None = None
    # identity and ownership
    service_account: str | None = None
    owner_pod_name: str | None = None
    owner_pod_uid: str | None = None

    def __post_init__(self) -> None:
        problems = param_problems(self)
        if problems:
            raise ValueError("invalid MPIJob parameters: " + "; ".join(problems))

    @property
    def total_slots(self) -> int:
        """The Horovod world size: workers x slots per worker."""
        return self.workers * self.slots_per_worker

    @property
    def expected_model_uri(self) -> str:
        """Where the trainer exports the SavedModel."""
        return self.model_uri or storage.join(self.output_uri, "model")

    @property
    def summary_uri(self) -> str:
        """Where rank 0 writes ``run_summary.json``."""
        return storage.join(self.output_uri, "run_summary.json")


def _positive(problems: list[str], name: str, value: int | None, minimum: int = 1) -> None:
    if value is not None and (isinstance(value, bool) or value < minimum):
        problems.append(f"{name} must be >= {minimum}, got {value!r}")


def param_problems(p: MPIJobParams) -> list[str]:
    """Every problem with `p`, each naming the parameter; empty if it is valid."""
    problems: list[str] = []
    if not p.run_name or not p.run_name.strip():
        problems.append("run_name is empty")
    for name, uri in (("data_uri", p.data_uri), ("output_uri", p.output_uri)):
        if not storage.is_gcs(uri or ""):
            problems.append(
                f"{name} must be a gs:// URI for the MPIJob backend (its pods cannot see "
                f"the component's disk), got {uri!r}"
            )
    if p.model_uri is not None and not storage.is_gcs(p.model_uri):
        problems.append(
            f"model_uri must be a gs:// URI for the MPIJob backend, got {p.model_uri!r}"
        )
    if not p.image or any(c.isspace() for c in p.image):
        problems.append(f"image must be a non-empty image reference, got {p.image!r}")
    _positive(problems, "workers", p.workers)
    _positive(problems, "slots_per_worker", p.slots_per_worker)
    _positive(problems, "epochs", p.epochs)
    _positive(problems, "batch_size", p.batch_size)
    _positive(problems, "warmup_epochs", p.warmup_epochs, 0)
    _positive(problems, "threads_per_worker", p.threads_per_worker)
    _positive(problems, "stall_shutdown_seconds", p.stall_shutdown_seconds)
    if not p.learning_rate > 0:
        problems.append(f"learning_rate must be > 0, got {p.learning_rate!r}")
    _positive(problems, "gpus_per_worker", p.gpus_per_worker, 0)
    for name, qty in (
        ("cpu_per_worker", p.cpu_per_worker),
        ("memory_per_worker", p.memory_per_worker),
        ("launcher_cpu", p.launcher_cpu),
        ("launcher_memory", p.launcher_memory),
    ):
        if not _QUANTITY.match(str(qty)) or _is_zero(str(qty)):
            problems.append(
                f"{name} must be a positive Kubernetes quantity like '2', '500m', '4Gi', "
                f"got {qty!r}"
            )
    _positive(problems, "ttl_seconds_after_finished", p.ttl_seconds_after_finished, 0)
    _positive(problems, "backoff_limit", p.backoff_limit, 0)
    _positive(problems, "active_deadline_seconds", p.active_deadline_seconds)
    _positive(problems, "min_available", p.min_available)
    if p.min_available is not None and p.min_available > p.workers + 1:
        problems.append(
            f"min_available must be <= workers + 1 launcher = {p.workers + 1}, "
            f"got {p.min_available}"
        )
    for name, value in (
        ("queue", p.queue),
        ("priority_class", p.priority_class),
        ("scheduler_name", p.scheduler_name),
        ("service_account", p.service_account),
        ("owner_pod_name", p.owner_pod_name),
    ):
        if value is not None and not re.match(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$", value):
            problems.append(f"{name} must be a lower-case DNS name, got {value!r}")
    if p.owner_pod_uid and not p.owner_pod_name:
        problems.append("owner_pod_uid is set but owner_pod_name is not")
    return problems


def _is_zero(qty: str) -> bool:
    number = re.match(r"^[\d.]+", qty)
    return number is not None and float(number.group(0) or 0) == 0.0


def sanitize_name(text: str, max_length: int = MAX_NAME_LENGTH) -> str:
    """Lower-case `text` into a DNS-1035 label (letters, digits, '-'; starts with a letter).

    Returns ``""`` when nothing usable is left; the caller adds a prefix.
    """
    slug = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")
    slug = re.sub(r"^[^a-z]+", "", slug)  # must start with a letter
    return slug[:max_length].rstrip("-")


def job_name(run_name: str, pipeline_run_id: str = "") -> str:
    """The MPIJob's name: ``hvd-<run name slug>-<hash>``, a DNS-1035 label of <= 40 chars.

    Deterministic, so a retried KFP task finds the job its first attempt created; the hash of
    the full run name and run id keeps runs whose slugs collide apart.
    """
    digest = hashlib.sha256(f"{pipeline_run_id}\0{run_name}".encode()).hexdigest()[:8]
    prefix = defaults.MPIJOB_NAME_PREFIX
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


def trainer_config(p: MPIJobParams) -> TrainConfig:
    """The trainer settings this MPIJob runs with: world size = workers x slots per worker."""
    return TrainConfig(
        data=p.data_uri,
        output=p.output_uri,
        model_dir=p.model_uri,
        expected_workers=p.total_slots,
        epochs=p.epochs,
        batch_size_per_worker=p.batch_size,
        base_learning_rate=float(p.learning_rate),
        warmup_epochs=p.warmup_epochs,
        threads_per_worker=p.threads_per_worker,
        seed=p.seed,
    )


def trainer_args(p: MPIJobParams) -> list[str]:
    """The trainer's command line (``python -m components.train ...``) for these parameters."""
    return ["python", "-m", "components.train", *cli_args(trainer_config(p))]


def launcher_command(p: MPIJobParams) -> list[str]:
    """``mpirun`` over all slots, output tagged with each line's rank, running the trainer.

    The environment of the launcher's processes is forwarded with ``-x`` (ssh sessions on the
    workers do not inherit the worker container's environment). No ``btl`` selection: the
    image's Open MPI (Debian 4.1.4) already sets ``btl = ^uct,openib,ofi`` in
    ``/etc/openmpi/openmpi-mca-params.conf``, and a command-line list would replace that one
    (``-mca btl ^openib``, used before, re-enabled uct and ofi; a first run in containers
    reported ``MPI_Init`` failing with it).
    """
    return [
        "mpirun",
        "-np",
        str(p.total_slots),
        "--tag-output",
        "-bind-to",
        "none",
        "-map-by",
        "slot",
        "-wdir",
        defaults.TRAINER_WORKDIR,
        "-x",
        "PATH",
        "-x",
        "PYTHONUNBUFFERED=1",
        "-x",
        f"HOROVOD_STALL_SHUTDOWN_TIME_SECONDS={p.stall_shutdown_seconds}",
        "-mca",
        "pml",
        "ob1",
        *trainer_args(p),
    ]


def _resources(cpu: str, memory: str, gpus: int) -> dict[str, Any]:
    amounts: dict[str, Any] = {"cpu": cpu, "memory": memory}
    if gpus:
        amounts[_GPU_RESOURCE] = gpus
    return {"requests": dict(amounts), "limits": dict(amounts)}


def _security_context() -> dict[str, Any]:
    return {
        "runAsUser": defaults.MPI_USER_UID,
        "runAsGroup": defaults.MPI_USER_UID,
        "runAsNonRoot": True,
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
    }


def _pod_template(
    p: MPIJobParams, name: str, role: str, container: dict[str, Any]
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "containers": [container],
        "securityContext": {"fsGroup": defaults.MPI_USER_UID},
    }
    if p.service_account:
        spec["serviceAccountName"] = p.service_account
    if p.priority_class:
        spec["priorityClassName"] = p.priority_class
    if p.scheduler_name:
        spec["schedulerName"] = p.scheduler_name
    if role == "worker" and p.gpus_per_worker:
        spec["tolerations"] = [{"key": _GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}]
    return {
        "metadata": {"labels": {**_common_labels(p), LABEL_JOB: name, LABEL_ROLE: role}},
        "spec": spec,
    }


def _common_labels(p: MPIJobParams) -> dict[str, str]:
    labels = {
        "app.kubernetes.io/name": "kfp-horovod",
        "app.kubernetes.io/component": "trainer",
        "app.kubernetes.io/managed-by": "kfp-horovod",
        LABEL_RUN_NAME: label_value(p.run_name) or "run",
    }
    if p.pipeline_run_id:
        labels[LABEL_RUN_ID] = label_value(p.pipeline_run_id)
    return labels


def build_manifest(p: MPIJobParams, namespace: str | None = None) -> dict[str, Any]:
    """The MPIJob for `p`: one launcher running ``mpirun``, `p.workers` workers running sshd."""
    name = job_name(p.run_name, p.pipeline_run_id)
    launcher = {
        "name": "launcher",
        "image": p.image,
        "imagePullPolicy": "IfNotPresent",
        "command": launcher_command(p),
        "resources": _resources(p.launcher_cpu, p.launcher_memory, 0),
        "securityContext": _security_context(),
    }
    worker = {
        "name": "worker",
        "image": p.image,
        "imagePullPolicy": "IfNotPresent",
        "command": ["/usr/sbin/sshd"],
        "args": ["-De", "-f", defaults.MPI_SSHD_CONFIG],
        "ports": [{"name": "ssh", "containerPort": defaults.MPI_SSHD_PORT, "protocol": "TCP"}],
        "readinessProbe": {
            "tcpSocket": {"port": defaults.MPI_SSHD_PORT},
            "initialDelaySeconds": 2,
            "periodSeconds": 2,
        },
        "resources": _resources(p.cpu_per_worker, p.memory_per_worker, p.gpus_per_worker),
        "securityContext": _security_context(),
    }
    run_policy: dict[str, Any] = {
        "cleanPodPolicy": "Running",
        "ttlSecondsAfterFinished": p.ttl_seconds_after_finished,
        "backoffLimit": p.backoff_limit,
        "activeDeadlineSeconds": p.active_deadline_seconds,
    }
    scheduling: dict[str, Any] = {}
    if p.queue:
        scheduling["queue"] = p.queue
    if p.priority_class:
        scheduling["priorityClass"] = p.priority_class
    if p.min_available is not None:
        scheduling["minAvailable"] = p.min_available
    if scheduling:
        run_policy["schedulingPolicy"] = scheduling
    metadata: dict[str, Any] = {
        "name": name,
        "labels": _common_labels(p),
        "annotations": {ANNOTATION_RUN_NAME: p.run_name, ANNOTATION_RUN_ID: p.pipeline_run_id},
    }
    if namespace:
        metadata["namespace"] = namespace
    if p.owner_pod_name and p.owner_pod_uid:
        metadata["ownerReferences"] = [owner_reference(p.owner_pod_name, p.owner_pod_uid)]
    return {
        "apiVersion": f"{API_GROUP}/{API_VERSION}",
        "kind": KIND,
        "metadata": metadata,
        "spec": {
            "slotsPerWorker": p.slots_per_worker,
            "launcherCreationPolicy": "WaitForWorkersReady",
            "mpiImplementation": "OpenMPI",
            "sshAuthMountPath": defaults.MPI_SSH_AUTH_MOUNT_PATH,
            "runPolicy": run_policy,
            "mpiReplicaSpecs": {
                "Launcher": {
                    "replicas": 1,
                    "restartPolicy": "OnFailure",
                    "template": _pod_template(p, name, "launcher", launcher),
                },
                "Worker": {
                    "replicas": p.workers,
                    "restartPolicy": "Never",
                    "template": _pod_template(p, name, "worker", worker),
                },
            },
        },
    }


def owner_reference(pod_name: str, pod_uid: str) -> dict[str, Any]:
    """An owner reference to the component's pod: the job is garbage-collected with it."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "name": pod_name,
        "uid": pod_uid,
        "controller": False,
        "blockOwnerDeletion": False,
    }


def command_line(p: MPIJobParams) -> str:
    """The launcher command as one shell-quoted line (for logs and docs)."""
    return shlex.join(launcher_command(p))
