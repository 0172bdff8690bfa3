"""A stand-in for Kubeflow Trainer v2.3 (its MPI plugin), JobSet and the kubelet: runs a
TrainingRuntime and a TrainJob in Docker.

There is no Kubernetes cluster here, so this harness makes of the two manifests that
``render-trainjob`` and the train component build (the same builder; nothing here holds a
second copy of any command) the JobSet that Trainer would make, and runs its pods the way
JobSet's Jobs and the kubelet would. Read from kubeflow/trainer at v2.3.0:

- ``pkg/runtime/core/trainingruntime.go`` (``newRuntimeInfo``): one pod set per replicated job
  of the runtime's JobSet, in its order; the trainer-ancestor job (label
  ``trainer.kubeflow.org/trainjob-ancestor-step: trainer``) has ``mlPolicy.numNodes`` pods;
  ``spec.trainer.resourcesPerNode`` is merged into the ``node`` container of that job and, with
  ``runLauncherAsNode``, of the ``node`` job.
- ``pkg/runtime/framework/plugins/mpi/mpi.go``: the ``node`` job has ``numNodes`` pods, or
  ``max(numNodes - 1, 1)`` with ``runLauncherAsNode`` (the launcher is a node); slots are the
  TrainJob's ``numProcPerNode``, else the runtime's. The ``<trainjob>-mpi-ssh-auth`` Secret (a
  fresh ECDSA P-521 key) is mounted at ``sshAuthMountPath`` on every ``node`` container of both
  jobs, items ``id_rsa`` 0640, ``id_rsa.pub`` and ``authorized_keys`` 0644; the
  ``<trainjob>-mpi-hostfile`` ConfigMap (``<endpoint> slots=<n>`` for each pod of each job that
  is a node, in the runtime's order) at ``/etc/mpi`` (``hostfile``, 0444) and Open MPI's
  variables on the launcher's ``node`` container only.
- ``pkg/runtime/framework/plugins/jobset/jobset.go`` and ``builder.go``: endpoints
  ``<trainjob>-<job>-<jobIndex>-<podIndex>.<subdomain>`` (subdomain: the TrainJob's name);
  ``spec.trainer`` image, command and args on the trainer ancestor's ``node`` container only
  (kubeflow/trainer#4030); ``spec.trainer.env`` upserted there and, with ``runLauncherAsNode``,
  on the ``node`` job's.
- JobSet and its Jobs: pod hostname ``<trainjob>-<job>-<jobIndex>-<podIndex>``, aliased with
  the subdomain (the JobSet's headless Service) and its ``.<namespace>.svc[.cluster.local]``
  forms; labels ``jobset.sigs.k8s.io/jobset-name`` and ``.../replicatedjob-name`` (here Docker
  labels); ``JOB_COMPLETION_INDEX`` (Indexed Jobs); a job that ``dependsOn`` another's
  ``Ready`` starts once every pod of that one passes its readiness probe. `jobset_status`:
  Completed once the successPolicy's target jobs succeeded, Failed once any pod failed
  (restarts, ``failurePolicy.maxRestarts``, are not played).
- The kubelet: as in `standins.pods` (user, fsGroup, capabilities, limits scaled to this
  machine, TCP readiness probes), volumes as in `standins.kubelet_volumes`, root:fsGroup.

The one thing it adds that the manifests do not say: ``STORAGE_EMULATOR_HOST``, pointing at the
GCS emulator container on the job's network. It is set on the launcher and forwarded to the
ranks with ``mpirun -x STORAGE_EMULATOR_HOST``, in place of the Workload Identity that gives
the pods GCS on GKE (as `mpijob_harness` does).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from standins.kubelet_volumes import kubelet_volume
from standins.pods import (
    DockerPods,
    PodTemplate,
    forward_emulator,
    machine_cpus,
    machine_memory,
    ssh_key,
)

# Kubeflow Trainer's names (pkg/constants/constants.go at v2.3.0) and JobSet's labels, kept here
# rather than imported from the builder, so that a wrong name there fails here.
NODE, LAUNCHER = "node", "launcher"
ANCESTOR_LABEL = "trainer.kubeflow.org/trainjob-ancestor-step"
ANCESTOR_TRAINER = "trainer"
JOBSET_NAME_LABEL = "jobset.sigs.k8s.io/jobset-name"
REPLICATED_JOB_LABEL = "jobset.sigs.k8s.io/replicatedjob-name"
HOSTFILE_DIR, HOSTFILE = "/etc/mpi", "hostfile"
# The SSH Secret's volume items: file -> (Secret key, mode); its defaultMode 0400 covers none.
SSH_ITEMS = {
    "id_rsa": ("ssh-privatekey", 0o640),
    "id_rsa.pub": ("ssh-publickey", 0o644),
    "authorized_keys": ("ssh-publickey", 0o644),
}
LABEL = "kfp-horovod.test/trainjob"


@dataclass(frozen=True)
class ReplicatedJob:
    """A replicated job of the JobSet Trainer makes, its pod template as Trainer leaves it."""

    name: str
    replicas: int
    pods: int  # per replica: the Job's parallelism and completions
    ancestor: str | None
    depends_on: tuple[tuple[str, str], ...]  # (job, status)
    labels: dict[str, str]
    pod: dict[str, Any]
    template: PodTemplate  # its `node` container

    def pod_names(self, jobset: str) -> list[str]:
        return [
            f"{jobset}-{self.name}-{j}-{i}" for j in range(self.replicas) for i in range(self.pods)
        ]


def slots_per_node(runtime: dict[str, Any], trainjob: dict[str, Any]) -> int:
    """The MPI plugin's numProcPerNode: the TrainJob's, else the runtime's (Trainer also makes
    a runtime's 1 the GPUs per node when the TrainJob sets none; the project always sets it)."""
    mpi = runtime["spec"]["mlPolicy"]["mpi"]
    trainer = trainjob["spec"].get("trainer") or {}
    return int(trainer.get("numProcPerNode") or mpi.get("numProcPerNode") or 1)


def openmpi_env(slots: int) -> list[dict[str, str]]:
    """What the MPI plugin sets on the launcher's ``node`` container for Open MPI."""
    return [
        {"name": "OMPI_MCA_orte_default_hostfile", "value": f"{HOSTFILE_DIR}/{HOSTFILE}"},
        {"name": "OMPI_MCA_orte_keep_fqdn_hostnames", "value": "true"},
        {"name": "OMPI_MCA_orte_set_default_slots", "value": str(slots)},
        {"name": "OMPI_MCA_plm_rsh_args", "value": "-o ConnectionAttempts=10"},
    ]


def replicated_jobs(runtime: dict[str, Any], trainjob: dict[str, Any]) -> list[ReplicatedJob]:
    """The runtime's replicated jobs, in order, with what Trainer changes in each."""
    policy = runtime["spec"].get("mlPolicy", {})
    as_node = bool(policy["mpi"].get("runLauncherAsNode", False))
    trainer = trainjob["spec"].get("trainer") or {}
    jobs = []
    for rjob in runtime["spec"]["template"]["spec"]["replicatedJobs"]:
        name, job = rjob["name"], rjob["template"]
        ancestor = job.get("metadata", {}).get("labels", {}).get(ANCESTOR_LABEL)
        trainer_job = ancestor == ANCESTOR_TRAINER
        pods = int(job["spec"].get("parallelism", 1))
        if trainer_job:
            pods = int(policy.get("numNodes", 1))
        if name == NODE and "numNodes" in trainer:
            pods = max(int(trainer["numNodes"]) - 1, 1) if as_node else int(trainer["numNodes"])
        pod = copy.deepcopy(job["spec"]["template"])
        for container in pod["spec"]["containers"]:
            if container["name"] == NODE:
                _apply(container, name, trainer_job, as_node and name == NODE, trainer)
                if name == LAUNCHER:
                    _upsert_env(container, openmpi_env(slots_per_node(runtime, trainjob)))
        jobs.append(
            ReplicatedJob(
                name=name,
                replicas=1 if trainer_job else int(rjob.get("replicas", 1)),
                pods=pods,
                ancestor=ancestor,
                depends_on=tuple((d["name"], d["status"]) for d in rjob.get("dependsOn", [])),
                labels=dict(pod.get("metadata", {}).get("labels", {})),
                pod=pod,
                template=PodTemplate.read(pod, NODE),
            )
        )
    return jobs


def _apply(
    container: dict[str, Any], job: str, trainer_job: bool, node_job: bool, trainer: dict[str, Any]
) -> None:
    """The TrainJob's trainer fields on a ``node`` container of `job`: resources and env on the
    trainer ancestor's and (launcher as node) the node job's; image, command, args on the
    trainer ancestor's alone."""
    if (trainer_job or node_job) and trainer.get("resourcesPerNode"):
        base, override = container.get("resources", {}), trainer["resourcesPerNode"]
        container["resources"] = {
            key: {**base.get(key, {}), **override.get(key, {})}
            for key in ("limits", "requests")
            if key in base or key in override
        }
    if trainer_job:
        for key in ("image", "command", "args"):
            if trainer.get(key) is not None:
                container[key] = list(trainer[key]) if key != "image" else trainer[key]
    if trainer_job or node_job:
        _upsert_env(container, trainer.get("env", []))


def _upsert_env(container: dict[str, Any], env: list[dict[str, str]]) -> None:
    current = container.setdefault("env", [])
    for var in env:
        at = [i for i, e in enumerate(current) if e["name"] == var["name"]]
        if at:
            current[at[0]] = dict(var)
        else:
            current.append(dict(var))


@dataclass
class TrainJobRun(DockerPods):
    """One execution of a (TrainingRuntime, TrainJob) pair: `start_nodes`, `wait_ready`,
    `run_launcher` (or `start_launcher` and `wait_launcher`).

    `emulator` is the GCS emulator container (joined to the job's network as ``gcs``);
    `workdir` holds the Secret and ConfigMap volumes. Use as a context manager: everything it
    made is removed on exit.
    """

    label = LABEL
    runtime: dict[str, Any]
    trainjob: dict[str, Any]
    docker: Any
    workdir: Path
    emulator: Any = None
    emulator_port: int = 9023
    machine_cpus: float = field(default_factory=machine_cpus)
    machine_memory: float = field(default_factory=machine_memory)
    pods: dict[str, list[Any]] = field(default_factory=dict)  # by replicated job
    network: Any = None
    launcher: Any = None

    def __post_init__(self) -> None:
        meta = self.trainjob["metadata"]
        self.name = meta["name"]
        self.namespace: str = meta.get("namespace") or "default"
        mpi = self.runtime["spec"]["mlPolicy"]["mpi"]
        self.ssh_mount: str = mpi["sshAuthMountPath"]
        self.launcher_as_node = bool(mpi.get("runLauncherAsNode", False))
        self.slots = slots_per_node(self.runtime, self.trainjob)
        network = self.runtime["spec"]["template"]["spec"].get("network") or {}
        self.subdomain: str = network.get("subdomain") or self.name
        self.jobs = {job.name: job for job in replicated_jobs(self.runtime, self.trainjob)}
        self.scale = self.fit(
            [job.template for job in self.jobs.values() for _ in job.pod_names(self.name)]
        )
        self.suffix = self.new_suffix()  # in Docker names only
        self._key = ssh_key()

    def containers(self) -> list[Any]:
        return [c for pods in self.pods.values() for c in pods]

    @property
    def nodes(self) -> list[Any]:
        """The node job's pods."""
        return self.pods.get(NODE, [])

    # --- names, as JobSet and Trainer make them ----------------------------------------------

    def pod_name(self, job: str, i: int = 0) -> str:
        return self.jobs[job].pod_names(self.name)[i]

    def endpoints(self, job: str) -> list[str]:
        return [f"{pod}.{self.subdomain}" for pod in self.jobs[job].pod_names(self.name)]

    def is_node(self, job: str) -> bool:
        return job == NODE or (self.launcher_as_node and job == LAUNCHER)

    def hostfile(self) -> str:
        """The ``<trainjob>-mpi-hostfile`` ConfigMap's ``hostfile``."""
        return "".join(
            f"{endpoint} slots={self.slots}\n"
            for job in self.jobs
            if self.is_node(job)
            for endpoint in self.endpoints(job)
        )

    def aliases(self, pod: str) -> list[str]:
        fqdn = f"{pod}.{self.subdomain}"
        svc = f"{fqdn}.{self.namespace}.svc"
        return [pod, fqdn, svc, f"{svc}.cluster.local"]

    # --- volumes -----------------------------------------------------------------------------

    def _ssh_volume(self, group: int | None) -> Path:
        """The ``<trainjob>-mpi-ssh-auth`` Secret as the kubelet mounts it for fsGroup `group`."""
        root = self.workdir / f"ssh-{group}"
        if not root.exists():
            data = {"ssh-privatekey": self._key[0], "ssh-publickey": self._key[1]}
            files = {path: (data[key], mode) for path, (key, mode) in SSH_ITEMS.items()}
            kubelet_volume(root, files, group)
        return root

    def _volumes(self, job: ReplicatedJob) -> dict[str, dict[str, str]]:
        group = job.template.fs_group
        volumes = {str(self._ssh_volume(group)): {"bind": self.ssh_mount, "mode": "ro"}}
        if job.name == LAUNCHER:
            root = self.workdir / f"hostfile-{job.name}"
            kubelet_volume(root, {HOSTFILE: (self.hostfile().encode(), 0o444)}, group)
            volumes[str(root)] = {"bind": HOSTFILE_DIR, "mode": "ro"}
        return volumes

    # --- pods --------------------------------------------------------------------------------

    def _start_job(self, job: ReplicatedJob, env: dict[str, str]) -> None:
        template, extra = job.template, dict(env)
        if job.ancestor == ANCESTOR_TRAINER and self.emulator is not None:
            template = PodTemplate(
                **{**template.__dict__, "command": forward_emulator(template.command)}
            )
            extra.update(self.emulator_env())
        labels = {**job.labels, JOBSET_NAME_LABEL: self.name, REPLICATED_JOB_LABEL: job.name}
        volumes = self._volumes(job)
        started = self.pods.setdefault(job.name, [])
        for pod in job.pod_names(self.name):
            index = str(len(started) % job.pods)
            container = self.create_pod(
                pod, template, {**extra, "JOB_COMPLETION_INDEX": index}, self.aliases(pod),
                labels, volumes=volumes,
            )  # fmt: skip
            container.start()
            started.append(container)

    def start_nodes(self, env: dict[str, str] | None = None) -> None:
        """Create the network and start every job that depends on none (the node job)."""
        self.open_network()
        for job in self.jobs.values():
            if not job.depends_on:
                self._start_job(job, env or {})

    def wait_ready(self, timeout: float = 120) -> float:
        """Wait for every pod of each job another depends on being Ready (its readiness
        probe). Returns the seconds it took; raises TimeoutError naming the pods not ready."""
        seconds = 0.0
        for name in {dep for job in self.jobs.values() for dep, _ in job.depends_on}:
            seconds += self.wait_pods_ready(self.pods[name], self.jobs[name].template, timeout)
        return seconds

    def start_launcher(self) -> Any:
        """Start every job that depends on another (the launcher; after `wait_ready`)."""
        for job in self.jobs.values():
            if job.depends_on:
                if any(status != "Ready" for _, status in job.depends_on):
                    raise NotImplementedError(f"{job.name}: dependsOn {job.depends_on}")
                self._start_job(job, {})
        trainer_jobs = [j.name for j in self.jobs.values() if j.ancestor == ANCESTOR_TRAINER]
        self.launcher = self.pods[trainer_jobs[0]][0]
        return self.launcher

    def kill_node(self, i: int) -> None:
        """SIGKILL the node job's pod `i`: a node lost, or a pod evicted without grace."""
        self.nodes[i].kill()

    def node_logs(self) -> dict[str, str]:
        return {self.pod_name(NODE, i): c.logs().decode(errors="replace") for i, c in
                enumerate(self.nodes)}  # fmt: skip

    def jobset_status(self) -> tuple[str, str]:
        """``(condition, message)``: ``Failed`` once a pod of any job ended non-zero (Jobs of
        backoffLimit 0), else ``Completed`` once every pod of the successPolicy's target jobs
        ended 0 (operator All), else ``Running``."""
        codes = {name: [_exit_code(c) for c in pods] for name, pods in self.pods.items()}
        failed = [name for name, ended in codes.items() if any(c not in (None, 0) for c in ended)]
        if failed:
            return "Failed", f"replicated jobs failed: {', '.join(failed)}"
        policy = self.runtime["spec"]["template"]["spec"].get("successPolicy") or {}
        targets = policy.get("targetReplicatedJobs") or list(self.jobs)
        if all(codes.get(t) and all(c == 0 for c in codes[t]) for t in targets):
            return "Completed", f"jobs completed: {', '.join(targets)}"
        return "Running", ""


def _exit_code(container: Any) -> int | None:
    container.reload()
    if container.status in ("created", "running", "restarting"):
        return None
    return int(container.attrs["State"]["ExitCode"])
