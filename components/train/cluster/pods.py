"""What the launcher runs and what every pod of a cluster job is made of, for both backends.

The launcher's command is built here once: ``mpiwatch -- mpirun ... python -m
components.train ...`` for a static job (the MPIJob's launcher and the TrainJob's node 0 run
the same line), elastic ``horovodrun`` for an elastic MPIJob. The pods' pieces (resources,
security context, the workers' sshd, placement) are the same on an MPIJob and a
TrainingRuntime. Placement (`placement`: the ``node_selector`` and ``tolerations`` parameters
and the task config's) goes on every pod of the job: each runs a rank, except the MPIJob's
launcher, which is placed in the same pool on purpose (a team's tainted pool or an Autopilot
class may be the only place the job may run; it asks for no GPU). Nothing here talks to a
cluster or reads the environment.
"""

from __future__ import annotations

from typing import Any

from components.common import defaults
from components.common.placement import merge_tolerations, parse_node_selector, parse_tolerations
from components.train import launch
from components.train.cluster.job import ClusterJobParams
from components.train.cluster.podconfig import GPU_RESOURCE, STALL_BOUND, UNBUFFERED
from components.train.config import to_argv
from components.train.mpiwatch import HEARTBEAT_ENV, period_for

GPU_TOLERATION = {"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}
# Where mpi-operator v2beta1 keeps the launcher's host discovery script: it lists the worker
# pods that are running now (``echo <pod>.<job>-worker.<namespace>.svc`` per pod, no slots).
# Kubeflow Trainer v2 has none, so elastic jobs are MPIJob-only.
DISCOVER_HOSTS = "/etc/mpi/discover_hosts.sh"


def trainer_command(p: ClusterJobParams) -> list[str]:
    """The trainer's command line (``python -m components.train ...``) for these parameters."""
    return ["python", "-m", "components.train", *to_argv(p.train)]


def launcher_command(p: ClusterJobParams) -> list[str]:
    """The launcher's command: `watched_command`, or for an elastic job `elastic_command`."""
    return elastic_command(p) if p.train.elastic else watched_command(p)


def watched_command(p: ClusterJobParams) -> list[str]:
    """`mpirun_command` run by `components.train.mpiwatch`: a rank that sends no heartbeat for
    ``stall_shutdown_seconds`` (frozen, or its node or network down) ends the job, named."""
    return [
        "python", "-m", "components.train.mpiwatch",
        "--ranks", str(p.train.world_size),
        "--silence-seconds", str(p.step.stall_shutdown_seconds),
        "--", *mpirun_command(p),
    ]  # fmt: skip


def elastic_command(p: ClusterJobParams) -> list[str]:
    """Elastic ``horovodrun`` (run by `components.train.launch`) over ssh to the workers.

    It starts once ``--min-np`` slots are up, finds the workers with the operator's
    `DISCOVER_HOSTS` (``--slots``: the script gives no slot counts), keeps going while at
    least ``min_workers`` workers are left, and grows back to ``workers`` as pods return. The
    ranks inherit the launcher's environment (`launcher_env`); ssh reaches the workers' sshd on
    its port through the image's ssh client config.
    """
    t = p.train
    return [
        "python", "-m", "components.train.launch",
        "-np", str(t.world_size), "--min-np", str(t.min_world_size),
        "--max-np", str(t.world_size), "--slots", str(t.slots_per_worker),
        "--host-discovery-script", DISCOVER_HOSTS, "--gloo",
        *trainer_command(p),
    ]  # fmt: skip


def rank_env(p: ClusterJobParams) -> dict[str, str]:
    """What the job sets in its launcher's and ranks' environment (the task config may not set
    these: `components.train.cluster.podconfig.JOB_ENV`): unbuffered output, so that the
    launcher's log streams, and Horovod's stall bound."""
    return {UNBUFFERED: "1", STALL_BOUND: str(p.step.stall_shutdown_seconds)}


def launcher_env(p: ClusterJobParams) -> list[dict[str, str]]:
    """The launcher container's environment, on both backends: `rank_env`, which a static
    job's ``mpirun -x`` forwards and an elastic job's horovodrun passes on to the ranks."""
    return [{"name": name, "value": value} for name, value in rank_env(p).items()]


def mpirun_command(p: ClusterJobParams) -> list[str]:
    """The static job's ``mpirun`` (`components.train.launch`: the local launcher's command
    line, waiting ranks yielding their core) over the hostfile the operator gives the launcher.

    The environment of the launcher's processes is forwarded with ``-x`` (ssh sessions on the
    workers do not inherit the worker container's environment), with the heartbeat period
    that `watched_command`'s watch needs (`components.train.mpiwatch`). No ``btl`` selection: the
    image's Open MPI (Debian 4.1.4) already sets ``btl = ^uct,openib,ofi`` in
    ``/etc/openmpi/openmpi-mca-params.conf``, and a command-line list would replace that one
    (``-mca btl ^openib``, used before, re-enabled uct and ofi; a first run in containers
    reported ``MPI_Init`` failing with it).
    """
    forward = [
        "PATH",
        *(f"{name}={value}" for name, value in rank_env(p).items()),
        f"{HEARTBEAT_ENV}={period_for(p.step.stall_shutdown_seconds):g}",
        *(str(e["name"]) for e in p.task_config.env),  # the task config's, set on the launcher
    ]
    return launch.mpirun_command(
        p.train.world_size, trainer_command(p), forward=forward, workdir=defaults.TRAINER_WORKDIR
    )


def resources(cpu: str, memory: str, gpus: int) -> dict[str, Any]:
    """Requests = limits (Guaranteed QoS) of CPU, memory and, when asked for, GPUs."""
    amounts: dict[str, Any] = {"cpu": cpu, "memory": memory}
    if gpus:
        amounts[GPU_RESOURCE] = gpus
    return {"requests": dict(amounts), "limits": dict(amounts)}


def worker_resources(p: ClusterJobParams) -> dict[str, Any]:
    """A worker pod's (a TrainJob node's) resources."""
    return resources(p.step.cpu_per_worker, p.step.memory_per_worker, p.train.gpus_per_worker)


def security_context() -> dict[str, Any]:
    """Every container's: the image's non-root user, no privilege escalation, no capabilities."""
    return {
        "runAsUser": defaults.MPI_USER_UID,
        "runAsGroup": defaults.MPI_USER_UID,
        "runAsNonRoot": True,
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
    }


def placement(p: ClusterJobParams, gpus: bool) -> dict[str, Any]:
    """The pod spec's placement: the node selector of the parameter and the task config, the
    tolerations of both (and, for a pod that asks for GPUs, the usual GPU taint's), each once,
    and the task config's affinity."""
    spec: dict[str, Any] = {}
    selector = {**parse_node_selector(p.step.node_selector), **p.task_config.node_selector}
    if selector:
        spec["nodeSelector"] = selector
    own, gpu = parse_tolerations(p.step.tolerations), [GPU_TOLERATION] if gpus else []
    tolerations = merge_tolerations(own, p.task_config.tolerations, gpu)
    if tolerations:
        spec["tolerations"] = tolerations
    if p.task_config.affinity:
        spec["affinity"] = dict(p.task_config.affinity)
    return spec


def _with_task_config(p: ClusterJobParams, container: dict[str, Any]) -> dict[str, Any]:
    """`container` with the task config's environment and volume mounts added."""
    out = dict(container)
    if p.task_config.env:
        out["env"] = [*container.get("env", []), *p.task_config.env]
    if p.task_config.volume_mounts:
        out["volumeMounts"] = [*container.get("volumeMounts", []), *p.task_config.volume_mounts]
    return out


def pod_spec(p: ClusterJobParams, container: dict[str, Any], gpus: bool) -> dict[str, Any]:
    """A pod spec of one container with the job's fsGroup, identity, scheduling and placement
    (`placement`; `gpus`: the pod asks for GPUs, so it tolerates the usual GPU taint), and the
    task config's environment and volumes."""
    spec: dict[str, Any] = {
        "containers": [_with_task_config(p, container)],
        "securityContext": {"fsGroup": defaults.MPI_USER_UID},
    }
    if p.step.trainer_service_account:
        spec["serviceAccountName"] = p.step.trainer_service_account
    if p.step.priority_class:
        spec["priorityClassName"] = p.step.priority_class
    if p.step.scheduler_name:
        spec["schedulerName"] = p.step.scheduler_name
    spec.update(placement(p, gpus))
    if p.task_config.volumes:
        spec["volumes"] = list(p.task_config.volumes)
    return spec


def sshd_container(name: str, image: str) -> dict[str, Any]:
    """A worker's container: the image's non-root sshd on its unprivileged port, ready once it
    accepts a TCP connection (no resources: the caller sets them)."""
    return {
        "name": name,
        "image": image,
        "imagePullPolicy": "IfNotPresent",
        "command": ["/usr/sbin/sshd"],
        "args": ["-De", "-f", defaults.MPI_SSHD_CONFIG],
        "ports": [{"name": "ssh", "containerPort": defaults.MPI_SSHD_PORT, "protocol": "TCP"}],
        "readinessProbe": {
            "tcpSocket": {"port": defaults.MPI_SSHD_PORT},
            "initialDelaySeconds": 2,
            "periodSeconds": 2,
        },
        "securityContext": security_context(),
    }
