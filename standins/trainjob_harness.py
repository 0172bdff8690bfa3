"""A stand-in for Kubeflow Trainer v2.3 (its MPI plugin) and JobSet (with the kubelet of
`standins.pods`): makes of a TrainingRuntime and a TrainJob the JobSet Trainer would make, and
runs its pods in Docker as JobSet's Jobs would. Read from kubeflow/trainer at v2.3.0:

- ``pkg/runtime/core/trainingruntime.go``: ``spec.trainer.resourcesPerNode`` is merged into
  the ``node`` container of the trainer-ancestor job (label
  ``trainer.kubeflow.org/trainjob-ancestor-step: trainer``) and, with ``runLauncherAsNode``,
  of the ``node`` job.
- ``pkg/runtime/framework/plugins/mpi/mpi.go``: the ``node`` job has ``numNodes`` pods, or
  ``max(numNodes - 1, 1)`` with ``runLauncherAsNode`` (the launcher is a node); slots are the
  TrainJob's ``numProcPerNode``, else the runtime's. The ``<trainjob>-mpi-ssh-auth`` Secret is
  mounted at ``sshAuthMountPath`` on every ``node`` container, items ``id_rsa`` 0640,
  ``id_rsa.pub`` and ``authorized_keys`` 0644; the ``<trainjob>-mpi-hostfile`` ConfigMap
  (each pod that is a node, the ``node`` job's first) at ``/etc/mpi`` on the launcher.
- ``pkg/runtime/framework/plugins/jobset/``: endpoints ``<trainjob>-<job>-0-<index>.<subdomain>``
  (subdomain: the TrainJob's name); ``spec.trainer`` image, command and args on the trainer
  ancestor's ``node`` container only (kubeflow/trainer#4030); ``spec.trainer.env`` upserted
  there and, with ``runLauncherAsNode``, on the ``node`` job's.
- JobSet and its Jobs: pod hostname ``<trainjob>-<job>-0-<index>``, also reached as
  ``.<subdomain>`` and its ``.<namespace>.svc[.cluster.local]`` forms; labels
  ``jobset.sigs.k8s.io/jobset-name`` and ``.../replicatedjob-name`` (here Docker labels);
  ``JOB_COMPLETION_INDEX``; the launcher job ``dependsOn`` the node job's ``Ready``, so it
  starts once every node pod passes its readiness probe.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from standins.pods import DockerJob, PodTemplate

# Kubeflow Trainer's names (pkg/constants/constants.go at v2.3.0) and JobSet's labels, kept here
# rather than imported from the builder, so that a wrong name there fails here.
NODE, LAUNCHER = "node", "launcher"
ANCESTOR_LABEL = "trainer.kubeflow.org/trainjob-ancestor-step"
JOBSET_NAME_LABEL = "jobset.sigs.k8s.io/jobset-name"
REPLICATED_JOB_LABEL = "jobset.sigs.k8s.io/replicatedjob-name"
LABEL = "kfp-horovod.test/trainjob"


def node_template(rjob: dict[str, Any], trainer: dict[str, Any], as_node: bool) -> PodTemplate:
    """The ``node`` container of replicated job `rjob` once Trainer has set the TrainJob's
    `trainer` fields on it: resources and env on the trainer ancestor's and (launcher as node)
    the node job's; image, command and args on the trainer ancestor's alone."""
    job = rjob["template"]
    pod = copy.deepcopy(job["spec"]["template"])
    ancestor = job.get("metadata", {}).get("labels", {}).get(ANCESTOR_LABEL) == "trainer"
    container = next(c for c in pod["spec"]["containers"] if c["name"] == NODE)
    if ancestor or (as_node and rjob["name"] == NODE):
        base, override = container.get("resources", {}), trainer.get("resourcesPerNode") or {}
        container["resources"] = {
            key: {**base.get(key, {}), **override.get(key, {})} for key in ("limits", "requests")
        }
        env = {e["name"]: e for e in container.get("env", [])}
        container["env"] = list({**env, **{e["name"]: e for e in trainer.get("env", [])}}.values())
    if ancestor:
        container.update({k: trainer[k] for k in ("image", "command", "args") if k in trainer})
    return PodTemplate.read(pod, NODE)


class TrainJobRun(DockerJob):
    """One execution of a (TrainingRuntime, TrainJob) pair (see `standins.pods.DockerJob`):
    the node job's pods are the workers, the launcher job's one pod the launcher."""

    label = LABEL
    ssh_modes = {"id_rsa": 0o640, "id_rsa.pub": 0o644, "authorized_keys": 0o644}

    def __init__(self, runtime: dict[str, Any], trainjob: dict[str, Any], docker: Any,
                 workdir: Path, **kw: Any) -> None:  # fmt: skip
        super().__init__(docker, workdir, **kw)
        meta, trainer = trainjob["metadata"], trainjob["spec"].get("trainer") or {}
        self.name, self.namespace = meta["name"], meta.get("namespace") or "default"
        mpi, spec = runtime["spec"]["mlPolicy"]["mpi"], runtime["spec"]["template"]["spec"]
        self.ssh_mount, self.as_node = mpi["sshAuthMountPath"], bool(mpi.get("runLauncherAsNode"))
        self.slots = int(trainer.get("numProcPerNode") or mpi.get("numProcPerNode") or 1)
        self.subdomain: str = (spec.get("network") or {}).get("subdomain") or self.name
        jobs = {r["name"]: r for r in spec["replicatedJobs"]}
        if [(d["name"], d["status"]) for d in jobs[LAUNCHER].get("dependsOn", [])] != [
            (NODE, "Ready")
        ]:
            raise NotImplementedError(f"{LAUNCHER}: dependsOn {jobs[LAUNCHER].get('dependsOn')}")
        nodes = int(trainer.get("numNodes") or runtime["spec"]["mlPolicy"].get("numNodes", 1))
        nodes = max(nodes - 1, 1) if self.as_node else nodes
        self.worker_names = [f"{self.name}-{NODE}-0-{i}" for i in range(nodes)]
        self.worker_template = node_template(jobs[NODE], trainer, self.as_node)
        self.launcher_name = f"{self.name}-{LAUNCHER}-0-0"
        self.launcher_template = node_template(jobs[LAUNCHER], trainer, self.as_node)

    def endpoint(self, pod: str) -> str:
        return f"{pod}.{self.subdomain}"

    def aliases(self, pod: str) -> list[str]:
        svc = f"{self.endpoint(pod)}.{self.namespace}.svc"
        return [pod, self.endpoint(pod), svc, f"{svc}.cluster.local"]

    def hostfile_pods(self) -> list[str]:
        return [*self.worker_names, *([self.launcher_name] if self.as_node else [])]

    def pod_env(self, pod: str) -> dict[str, str]:
        return {"JOB_COMPLETION_INDEX": pod.rsplit("-", 1)[1]}

    def pod_labels(self, pod: str) -> dict[str, str]:
        job = LAUNCHER if pod == self.launcher_name else NODE
        return {JOBSET_NAME_LABEL: self.name, REPLICATED_JOB_LABEL: job}
