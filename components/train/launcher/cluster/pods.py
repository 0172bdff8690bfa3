"""What the launcher runs and what every pod of a cluster job is made of, for both backends
(``mpiwatch -- mpirun ...`` for a static job, ``horovodrun`` for an elastic MPIJob). Runs in
the train step's pod and in the pipeline's CLI (``render-*``), which build the manifests.
"""

from __future__ import annotations

from typing import Any

from components.common import defaults
from components.common.defaults import GPU_RESOURCE
from components.common.placement import merge_tolerations
from components.train.config import to_argv
from components.train.launcher import launch
from components.train.launcher.cluster.job import STALL_BOUND, UNBUFFERED, ClusterJobParams
from components.train.rank.heartbeat import HEARTBEAT_ENV, period_for

# The MPIJob's launcher and the TrainJob's node 0 run the same line for a static job. Placement goes
# on every pod of the job: each runs a rank, except the MPIJob's launcher, which is placed in the
# same pool on purpose (a team's tainted pool or an Autopilot class may be the only place the job
# may run; it asks for no GPU).
GPU_TOLERATION = {"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}
# Where mpi-operator v2beta1 keeps the launcher's host discovery script: it lists the worker
# pods that are running now (``echo <pod>.<job>-worker.<namespace>.svc`` per pod, no slots).
# Kubeflow Trainer v2 has none, so elastic jobs are MPIJob-only.
DISCOVER_HOSTS = "/etc/mpi/discover_hosts.sh"


def trainer_command(p: ClusterJobParams) -> list[str]:
    return ["python", "-m", "components.train.rank", *to_argv(p.train)]


def launcher_command(p: ClusterJobParams) -> list[str]:
    """`mpirun_command` under `components.train.launcher.mpiwatch` (a rank that sends no heartbeat
    for
    ``stall_shutdown_seconds``, frozen or its node or network down, ends the job, named); for
    an elastic job, ``horovodrun`` over ssh to the workers the operator's `DISCOVER_HOSTS` finds
    (``--slots``: it gives no slot counts), whose ranks inherit the launcher's environment."""
    t = p.train
    if t.elastic:
        return [
            "python",
            "-m",
            "components.train.launcher.launch",
            "-np",
            str(t.world_size),
            "--min-np",
            str(t.min_world_size),
            "--max-np",
            str(t.world_size),
            "--slots",
            str(t.slots_per_worker),
            "--host-discovery-script",
            DISCOVER_HOSTS,
            "--gloo",
            *trainer_command(p),
        ]
    return [
        "python",
        "-m",
        "components.train.launcher.mpiwatch",
        "--ranks",
        str(t.world_size),
        "--silence-seconds",
        str(p.step.stall_shutdown_seconds),
        "--",
        *mpirun_command(p),
    ]


def launcher_env(p: ClusterJobParams) -> list[dict[str, str]]:
    """The launcher's environment, which reaches the ranks: unbuffered output, so that the
    launcher's log streams, and Horovod's stall bound."""
    env = {UNBUFFERED: "1", STALL_BOUND: str(p.step.stall_shutdown_seconds)}
    return [{"name": name, "value": value} for name, value in env.items()]


def mpirun_command(p: ClusterJobParams) -> list[str]:
    """``mpirun`` over the operator's hostfile, forwarding (``-x``; ssh sessions do not inherit
    the worker container's environment) the launcher's environment, the task config's and the
    heartbeat period. No ``btl`` selection: the image's Open MPI (Debian 4.1.4) already sets
    ``btl = ^uct,openib,ofi`` in ``/etc/openmpi/openmpi-mca-params.conf``, and a command-line
    list would replace it (``-mca btl ^openib`` re-enabled uct and ofi, and ``MPI_Init`` failed
    in containers with it).
    """
    forward = [
        "PATH",
        *(f"{e['name']}={e['value']}" for e in launcher_env(p)),
        f"{HEARTBEAT_ENV}={period_for(p.step.stall_shutdown_seconds):g}",
        *(str(e["name"]) for e in p.task_config.env),  # set on the launcher by `pod_spec`
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
    return resources(p.step.cpu_per_worker, p.step.memory_per_worker, p.train.gpus_per_worker)


def container(name: str, image: str, **fields: Any) -> dict[str, Any]:
    """A container of `image` with `fields`, as every container of the job runs: as the image's
    non-root user, without privilege escalation or capabilities."""
    uid = defaults.MPI_USER_UID
    return {
        "name": name,
        "image": image,
        "imagePullPolicy": "IfNotPresent",
        **fields,
        "securityContext": {
            "runAsUser": uid,
            "runAsGroup": uid,
            "runAsNonRoot": True,
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
        },
    }


def sshd_container(name: str, image: str) -> dict[str, Any]:
    """A worker's container: the image's non-root sshd on its unprivileged port, ready once it
    accepts a TCP connection (the caller sets its resources)."""
    port = defaults.MPI_SSHD_PORT
    return container(
        name,
        image,
        command=["/usr/sbin/sshd"],
        args=["-De", "-f", defaults.MPI_SSHD_CONFIG],
        ports=[{"name": "ssh", "containerPort": port, "protocol": "TCP"}],
        readinessProbe={"tcpSocket": {"port": port}, "initialDelaySeconds": 2, "periodSeconds": 2},
    )


def pod_spec(p: ClusterJobParams, one: dict[str, Any], gpus: bool) -> dict[str, Any]:
    """A pod spec of container `one` with the job's fsGroup, identity and scheduling, and the
    task config's node selector, tolerations (each once; with `gpus`, the usual GPU taint's
    too), affinity, environment and volumes."""
    tc = p.task_config
    one = dict(one)
    if tc.env:
        one["env"] = [*one.get("env", []), *tc.env]
    if tc.volume_mounts:
        one["volumeMounts"] = [*one.get("volumeMounts", []), *tc.volume_mounts]
    gpu = [GPU_TOLERATION] if gpus else []
    optional = {
        "serviceAccountName": p.step.trainer_service_account,
        "priorityClassName": p.step.priority_class,
        "schedulerName": p.step.scheduler_name,
        "nodeSelector": dict(tc.node_selector),
        "tolerations": merge_tolerations(tc.tolerations, gpu),
        "affinity": dict(tc.affinity),
        "volumes": list(tc.volumes),
    }
    return {
        "containers": [one],
        "securityContext": {"fsGroup": defaults.MPI_USER_UID},
        **{key: value for key, value in optional.items() if value},
    }
