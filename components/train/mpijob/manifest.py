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
from components.common.declare import Declared, declared, field_problems, param
from components.train import mpirun
from components.train.config import TrainConfig, to_argv
from components.train.heartbeat import HEARTBEAT_ENV, period_for

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
_DNS_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
_GPU_RESOURCE = "nvidia.com/gpu"


def dns_name_problem(value: str | None) -> str | None:
    """Why `value` is not a lower-case DNS name (None: not set), or None."""
    if value is None or _DNS_NAME.match(value):
        return None
    return f"must be a lower-case DNS name, got {value!r}"


@dataclass(frozen=True)
class MPIJobParams:
    """One MPIJob run of the trainer: its `TrainConfig` plus the pods' and run policy's fields.

    The trainer's URIs (`train.data`, `train.output`, `train.model_dir`) must be ``gs://``: the
    MPIJob's pods are not the component's pod and cannot see its disk, so the trainer reads the
    dataset and writes the model to GCS itself. The job has `train.workers` worker pods of
    `train.slots_per_worker` ranks each. The fields are declared (`param`): render-mpijob's
    options come from them.
    """

    train: TrainConfig
    run_name: str = param(help="names the MPIJob")
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
    launcher_cpu: str = param(defaults.LAUNCHER_CPU, "CPU of the launcher pod", quantity=True)
    launcher_memory: str = param(
        defaults.LAUNCHER_MEMORY, "memory of the launcher pod", quantity=True
    )
    # run policy
    ttl_seconds_after_finished: int = param(
        defaults.MPIJOB_TTL_SECONDS_AFTER_FINISHED, "seconds a finished job is kept", minimum=0
    )
    backoff_limit: int = param(defaults.MPIJOB_BACKOFF_LIMIT, "launcher retries", minimum=0)
    active_deadline_seconds: int = param(
        defaults.MPIJOB_ACTIVE_DEADLINE_SECONDS, "the job's deadline", minimum=1
    )
    # gang scheduling (Volcano / scheduler-plugins); all optional
    queue: str | None = param(None, "gang-scheduling queue (Volcano)", check=dns_name_problem)
    priority_class: str | None = param(None, "priority class of the pods", check=dns_name_problem)
    min_available: int | None = param(None, "gang size (default: all pods)", minimum=1)
    scheduler_name: str | None = param(None, "e.g. volcano", check=dns_name_problem)
    # identity and ownership
    service_account: str | None = param(
        None, "service account of the pods (Workload Identity)", check=dns_name_problem
    )
    owner_pod_name: str | None = param(None, "the pod that owns the job", check=dns_name_problem)
    owner_pod_uid: str | None = param(None, "its uid")

    def __post_init__(self) -> None:
        problems = param_problems(self)
        if problems:
            raise ValueError("invalid MPIJob parameters: " + "; ".join(problems))


MPIJOB_PARAMETERS: list[Declared] = declared(MPIJobParams)


def uri_problems(data: str, output: str, model_dir: str | None) -> list[str]:
    """The trainer's URIs that are not ``gs://`` (the MPIJob's pods cannot see local disk)."""
    return [
        f"{name} must be a gs:// URI for the MPIJob backend (its pods cannot see the "
        f"component's disk), got {uri!r}"
        for name, uri in (
            ("data", data), ("output", output), ("model_dir", model_dir)
        )
        if uri is not None and not storage.is_gcs(uri)
    ]  # fmt: skip


def param_problems(p: MPIJobParams) -> list[str]:
    """Every problem with `p`, each naming the parameter; empty if it is valid (the trainer's
    own fields were checked when `p.train` was made)."""
    problems = [] if p.run_name.strip() else ["run_name is empty"]
    problems += uri_problems(p.train.data, p.train.output, p.train.model_dir)
    if not p.image or any(c.isspace() for c in p.image):
        problems.append(f"image must be a non-empty image reference, got {p.image!r}")
    values = {f.name: getattr(p, f.name) for f in MPIJOB_PARAMETERS}
    problems += field_problems(MPIJOB_PARAMETERS, values)
    if p.min_available is not None and p.min_available > p.train.workers + 1:
        problems.append(
            f"min_available must be <= workers + 1 launcher = {p.train.workers + 1}, "
            f"got {p.min_available}"
        )
    if p.owner_pod_uid and not p.owner_pod_name:
        problems.append("owner_pod_uid is set but owner_pod_name is not")
    return problems


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


def trainer_command(p: MPIJobParams) -> list[str]:
    """The trainer's command line (``python -m components.train ...``) for these parameters."""
    return ["python", "-m", "components.train", *to_argv(p.train)]


def launcher_command(p: MPIJobParams) -> list[str]:
    """The launcher's command: `watched_command`, or for an elastic job `elastic_command`."""
    return elastic_command(p) if p.train.elastic else watched_command(p)


def watched_command(p: MPIJobParams) -> list[str]:
    """`mpirun_command` run by `components.train.mpiwatch`: a rank that sends no heartbeat for
    ``stall_shutdown_seconds`` (frozen, or its node or network down) ends the job, named."""
    return [
        "python", "-m", "components.train.mpiwatch",
        "--ranks", str(p.train.world_size), "--silence-seconds", str(p.stall_shutdown_seconds),
        "--", *mpirun_command(p),
    ]  # fmt: skip


# Where mpi-operator v2beta1 keeps the launcher's host discovery script: it lists the worker
# pods that are running now (``echo <pod>.<job>-worker.<namespace>.svc`` per pod, no slots).
DISCOVER_HOSTS = "/etc/mpi/discover_hosts.sh"


def elastic_command(p: MPIJobParams) -> list[str]:
    """Elastic ``horovodrun`` (run by `components.train.hvdrun`) over ssh to the workers.

    It starts once ``--min-np`` slots are up, finds the workers with the operator's
    `DISCOVER_HOSTS` (``--slots``: the script gives no slot counts), keeps going while at
    least ``min_workers`` workers are left, and grows back to ``workers`` as pods return. The
    ranks inherit the launcher's environment (`launcher_env`); ssh reaches the workers' sshd on
    its port through the image's ssh client config.
    """
    t = p.train
    return [
        "python", "-m", "components.train.hvdrun",
        "-np", str(t.world_size), "--min-np", str(t.min_world_size),
        "--max-np", str(t.world_size), "--slots", str(t.slots_per_worker),
        "--host-discovery-script", DISCOVER_HOSTS, "--gloo",
        *trainer_command(p),
    ]  # fmt: skip


def launcher_env(p: MPIJobParams) -> list[dict[str, str]]:
    """The launcher container's environment: what ``mpirun -x`` forwards in a static job, set
    on the launcher of an elastic one (horovodrun passes its environment to the ranks)."""
    if not p.train.elastic:
        return []
    return [
        {"name": "PYTHONUNBUFFERED", "value": "1"},
        {"name": "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS", "value": str(p.stall_shutdown_seconds)},
    ]


def mpirun_command(p: MPIJobParams) -> list[str]:
    """The static job's ``mpirun`` (`components.train.mpirun`: the local launcher's command
    line, waiting ranks yielding their core) over the hostfile mpi-operator gives the launcher.

    The environment of the launcher's processes is forwarded with ``-x`` (ssh sessions on the
    workers do not inherit the worker container's environment), with the heartbeat period
    that `watched_command`'s watch needs (`components.train.heartbeat`). No ``btl`` selection: the
    image's Open MPI (Debian 4.1.4) already sets ``btl = ^uct,openib,ofi`` in
    ``/etc/openmpi/openmpi-mca-params.conf``, and a command-line list would replace that one
    (``-mca btl ^openib``, used before, re-enabled uct and ofi; a first run in containers
    reported ``MPI_Init`` failing with it).
    """
    forward = [
        "PATH",
        "PYTHONUNBUFFERED=1",
        f"HOROVOD_STALL_SHUTDOWN_TIME_SECONDS={p.stall_shutdown_seconds}",
        f"{HEARTBEAT_ENV}={period_for(p.stall_shutdown_seconds):g}",
    ]
    return mpirun.mpirun_command(
        p.train.world_size, trainer_command(p), forward=forward, workdir=defaults.TRAINER_WORKDIR
    )


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
    if role == "worker" and p.train.gpus_per_worker:
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


def _launcher(p: MPIJobParams) -> dict[str, Any]:
    container: dict[str, Any] = {
        "name": "launcher",
        "image": p.image,
        "imagePullPolicy": "IfNotPresent",
        "command": launcher_command(p),
        "resources": _resources(p.launcher_cpu, p.launcher_memory, 0),
        "securityContext": _security_context(),
    }
    if env := launcher_env(p):
        container["env"] = env
    return container


def _worker(p: MPIJobParams) -> dict[str, Any]:
    return {
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
        "resources": _resources(p.cpu_per_worker, p.memory_per_worker, p.train.gpus_per_worker),
        "securityContext": _security_context(),
    }


def _run_policy(p: MPIJobParams) -> dict[str, Any]:
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
    return run_policy


def _metadata(p: MPIJobParams, name: str, namespace: str | None) -> dict[str, Any]:
    metadata: dict[str, Any] = {
        "name": name,
        "labels": _common_labels(p),
        "annotations": {ANNOTATION_RUN_NAME: p.run_name, ANNOTATION_RUN_ID: p.pipeline_run_id},
    }
    if namespace:
        metadata["namespace"] = namespace
    if p.owner_pod_name and p.owner_pod_uid:
        metadata["ownerReferences"] = [owner_reference(p.owner_pod_name, p.owner_pod_uid)]
    return metadata


def build_manifest(p: MPIJobParams, namespace: str | None = None) -> dict[str, Any]:
    """The MPIJob for `p`: one launcher running ``mpirun``, ``p.train.workers`` sshd workers."""
    name = job_name(p.run_name, p.pipeline_run_id)
    return {
        "apiVersion": f"{API_GROUP}/{API_VERSION}",
        "kind": KIND,
        "metadata": _metadata(p, name, namespace),
        "spec": {
            "slotsPerWorker": p.train.slots_per_worker,
            "launcherCreationPolicy": "WaitForWorkersReady",
            "mpiImplementation": "OpenMPI",
            "sshAuthMountPath": defaults.MPI_SSH_AUTH_MOUNT_PATH,
            "runPolicy": _run_policy(p),
            "mpiReplicaSpecs": {
                "Launcher": {
                    "replicas": 1,
                    "restartPolicy": "OnFailure",
                    "template": _pod_template(p, name, "launcher", _launcher(p)),
                },
                "Worker": {
                    "replicas": p.train.workers,
                    "restartPolicy": "Never",
                    "template": _pod_template(p, name, "worker", _worker(p)),
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
