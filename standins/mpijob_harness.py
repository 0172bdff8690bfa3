"""A stand-in for mpi-operator v2beta1 (with the kubelet of `standins.pods`): runs an MPIJob
manifest in Docker, as ``pkg/controller/mpi_job_controller.go`` of kubeflow/mpi-operator
makes its pods. What it adds to `standins.pods.DockerJob`:

- **Names**: worker *i* is the pod ``<job>-worker-<i>``, reached as that and as
  ``<job>-worker-<i>.<job>-worker.<namespace>.svc`` (pod hostname + the workers' headless
  Service as subdomain: the name the hostfile uses); the launcher is ``<job>-launcher``.
- **Env**: ``K_MPI_JOB_ROLE`` (worker or launcher) on every pod, and empty ``NVIDIA_*`` on the
  launcher.
- **SSH**: the ``<job>-ssh`` Secret (``id_rsa`` in "EC PRIVATE KEY" PEM, ``id_rsa.pub`` and
  ``authorized_keys`` = the public key), no ``defaultMode``: files mode 0644.
- **Config**: ``/etc/mpi/hostfile`` (``<worker fqdn> slots=<slotsPerWorker>`` per worker, mode
  0444) and ``/etc/mpi/discover_hosts.sh`` (the running workers, mode 0555), which
  `update_discovery` rewrites when the workers change (elastic jobs).
- **Launcher**: started once every worker is ready (``launcherCreationPolicy:
  WaitForWorkersReady``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from standins.pods import DockerJob, LauncherResult, PodTemplate, kubelet_volume, running

__all__ = ["LABEL", "LauncherResult", "MPIJobRun", "PodTemplate"]

LABEL = "kfp-horovod.test/mpijob"


class MPIJobRun(DockerJob):
    """One execution of an MPIJob `manifest` (see `standins.pods.DockerJob`)."""

    label = LABEL
    ssh_modes = {"id_rsa": 0o644, "id_rsa.pub": 0o644, "authorized_keys": 0o644}

    def __init__(self, manifest: dict[str, Any], docker: Any, workdir: Path, **kw: Any) -> None:
        super().__init__(docker, workdir, **kw)
        meta, spec = manifest["metadata"], manifest["spec"]
        self.name, self.namespace = meta["name"], meta.get("namespace") or "default"
        self.slots, self.ssh_mount = int(spec.get("slotsPerWorker", 1)), spec["sshAuthMountPath"]
        replicas = spec["mpiReplicaSpecs"]
        count = int(replicas["Worker"]["replicas"])
        self.worker_names = [f"{self.name}-worker-{i}" for i in range(count)]
        self.worker_template = PodTemplate.read(replicas["Worker"]["template"])
        self.launcher_name = f"{self.name}-launcher"
        self.launcher_template = PodTemplate.read(replicas["Launcher"]["template"])

    def endpoint(self, pod: str) -> str:
        return f"{pod}.{self.name}-worker.{self.namespace}.svc"

    def pod_env(self, pod: str) -> dict[str, str]:
        if pod != self.launcher_name:
            return {"K_MPI_JOB_ROLE": "worker"}
        return {"K_MPI_JOB_ROLE": "launcher", "NVIDIA_VISIBLE_DEVICES": "",
                "NVIDIA_DRIVER_CAPABILITIES": ""}  # fmt: skip

    def discover_hosts(self) -> str:
        pods = sorted(
            p for p, c in zip(self.worker_names, self.workers, strict=False) if running(c)
        )
        return "#!/bin/sh\n" + "".join(f"echo {self.endpoint(p)}\n" for p in pods)

    def config_files(self) -> dict[str, tuple[bytes, int]]:
        return {
            **super().config_files(),
            "discover_hosts.sh": (self.discover_hosts().encode(), 0o555),
        }

    def update_discovery(self) -> None:
        """What the operator does when the running workers change: rewrite
        ``discover_hosts.sh`` in the ConfigMap, which the kubelet swaps into the launcher's
        volume at once (the real kubelet takes up to its sync period, about a minute)."""
        group = self.launcher_template.fs_group
        kubelet_volume(self.workdir / "config", self.config_files(), group)
