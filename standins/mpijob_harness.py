"""A stand-in for mpi-operator v2beta1 and the kubelet: runs an MPIJob manifest in Docker.

There is no Kubernetes cluster here, so this harness does what the operator and the kubelet
would do with the manifest that ``render-mpijob`` and the train component build (the same
builder; nothing here holds a second copy of any command). It follows
``pkg/controller/mpi_job_controller.go`` of kubeflow/mpi-operator:

- **Network**: one user-defined Docker network, internal (no route out). Worker *i* is the
  pod ``<job>-worker-<i>``: that hostname, aliased ``<job>-worker-<i>`` and
  ``<job>-worker-<i>.<job>-worker.<namespace>.svc`` (pod hostname + the workers' headless
  Service as subdomain: the name the hostfile uses).
- **Docker names**: every container and the network carry a per-run suffix in their Docker
  name only (``<pod>-<suffix>``), so two test runs on one engine never clash on a name; the
  hostnames, aliases, hostfile and discovery script use the operator's names, as above.
- **Workers** run the Worker template's command and args as its ``runAsUser:runAsGroup``, with
  the pod's ``fsGroup`` as a supplementary group, its env plus ``K_MPI_JOB_ROLE=worker``, all
  capabilities dropped and no privilege escalation, and the template's CPU and memory limits as
  ``--cpus``/``--memory`` (scaled down proportionally when this machine is smaller than the
  job).
- **SSH**: a fresh ECDSA P-521 key per job, as the ``<job>-ssh`` Secret holds it (``id_rsa``
  in "EC PRIVATE KEY" PEM, ``id_rsa.pub`` and ``authorized_keys`` = the public key), mounted
  read-only at ``sshAuthMountPath`` the way the kubelet lays out a Secret volume with no
  ``defaultMode`` and an ``fsGroup``: files root:fsGroup mode 0644 behind ``..data`` symlinks,
  in a root:fsGroup directory of mode 3777.
- **Config**: ``/etc/mpi/hostfile`` (``<worker fqdn> slots=<slotsPerWorker>`` per worker, mode
  0444) and ``/etc/mpi/discover_hosts.sh`` (mode 0555), on the launcher only.
- **Launcher**: started only once every worker's readiness probe (TCP on the probe's port)
  passes (``launcherCreationPolicy: WaitForWorkersReady``); it runs the Launcher template's
  command as its user with the env the operator adds for Open MPI
  (``OMPI_MCA_orte_keep_fqdn_hostnames``, ``OMPI_MCA_orte_default_hostfile``,
  ``OMPI_MCA_plm_rsh_args``, ``OMPI_MCA_orte_set_default_slots``, ``K_MPI_JOB_ROLE=launcher``,
  empty ``NVIDIA_*``). Its exit code is the job's result.

The one thing it adds that the manifest does not say: ``STORAGE_EMULATOR_HOST``, pointing at the
GCS emulator container on the job's network. It is set on the launcher and forwarded to the
ranks with ``mpirun -x STORAGE_EMULATOR_HOST``, in place of the Workload Identity that gives
the pods GCS on GKE.

The Docker side (network, pod containers, readiness probes, the launcher's wait, removal) is
`standins.pods`, shared with `trainjob_harness`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from standins.kubelet_volumes import kubelet_swap, kubelet_volume
from standins.pods import (
    RUN_LABEL,
    DockerPods,
    LauncherResult,
    PodTemplate,
    forward_emulator,
    machine_cpus,
    machine_memory,
    quantity,
    running,
    ssh_key,
)

__all__ = ["CONFIG_MOUNT", "LABEL", "RUN_LABEL", "LauncherResult", "MPIJobRun", "PodTemplate",
           "quantity"]  # fmt: skip

CONFIG_MOUNT = "/etc/mpi"
LABEL = "kfp-horovod.test/mpijob"


@dataclass
class MPIJobRun(DockerPods):
    """One execution of an MPIJob manifest: `start_workers`, `wait_ready`, `run_launcher`.

    `emulator` is the GCS emulator container (joined to the job's network as ``gcs``);
    `workdir` holds the Secret and ConfigMap volumes. Use as a context manager: everything it
    made is removed on exit.
    """

    label = LABEL
    manifest: dict[str, Any]
    docker: Any
    workdir: Path
    emulator: Any = None
    emulator_port: int = 9023
    machine_cpus: float = field(default_factory=machine_cpus)
    machine_memory: float = field(default_factory=machine_memory)
    workers: list[Any] = field(default_factory=list)
    network: Any = None
    launcher: Any = None

    def __post_init__(self) -> None:
        meta, spec = self.manifest["metadata"], self.manifest["spec"]
        self.name = meta["name"]
        self.namespace: str = meta.get("namespace") or "default"
        self.slots: int = int(spec.get("slotsPerWorker", 1))
        self.ssh_mount: str = spec["sshAuthMountPath"]
        replicas = spec["mpiReplicaSpecs"]
        self.worker_count = int(replicas["Worker"]["replicas"])
        self.worker_template = PodTemplate.read(replicas["Worker"]["template"])
        self.launcher_template = PodTemplate.read(replicas["Launcher"]["template"])
        pods = [self.worker_template] * self.worker_count + [self.launcher_template]
        self.scale = self.fit(pods)
        self.suffix = self.new_suffix()  # in Docker names only (see the module doc)

    def containers(self) -> list[Any]:
        return [c for c in [*self.workers, self.launcher] if c is not None]

    # --- names, as the operator makes them ---------------------------------------------------

    def worker_name(self, i: int) -> str:
        return f"{self.name}-worker-{i}"

    def worker_fqdn(self, i: int) -> str:
        return f"{self.worker_name(i)}.{self.name}-worker.{self.namespace}.svc"

    def hostfile(self) -> str:
        return "".join(
            f"{self.worker_fqdn(i)} slots={self.slots}\n" for i in range(self.worker_count)
        )

    def discover_hosts(self) -> str:
        running_pods = sorted(self.worker_name(i) for i, c in enumerate(self.workers) if running(c))
        service = f"{self.name}-worker.{self.namespace}.svc"
        return "#!/bin/sh\n" + "".join(f"echo {pod}.{service}\n" for pod in running_pods)

    # --- volumes -----------------------------------------------------------------------------

    def _secret_volume(self) -> Path:
        """The ``<job>-ssh`` Secret as the kubelet mounts it (no defaultMode, with fsGroup)."""
        private, public = ssh_key()
        files = {
            "id_rsa": (private, 0o644),
            "id_rsa.pub": (public, 0o644),
            "authorized_keys": (public, 0o644),
        }
        return kubelet_volume(self.workdir / "ssh", files, self.worker_template.fs_group)

    def _config_volume(self) -> Path:
        """The ``<job>-config`` ConfigMap at /etc/mpi: hostfile 0444, discover_hosts.sh 0555."""
        files = {
            "hostfile": (self.hostfile().encode(), 0o444),
            "discover_hosts.sh": (self.discover_hosts().encode(), 0o555),
        }
        return kubelet_volume(self.workdir / "config", files, None)

    # --- pods --------------------------------------------------------------------------------

    def _create(
        self, name: str, template: PodTemplate, role: str, env: dict[str, str], **kw: Any
    ) -> Any:
        aliases = [name, f"{name}.{self.name}-worker.{self.namespace}.svc"]
        return self.create_pod(name, template, {**env, "K_MPI_JOB_ROLE": role}, aliases, **kw)

    def start_workers(self, env: dict[str, str] | None = None) -> None:
        """Create the network and the Secret, and start every worker pod."""
        self.open_network()
        ssh = self._secret_volume()
        volumes = {str(ssh): {"bind": self.ssh_mount, "mode": "ro"}}
        for i in range(self.worker_count):
            worker = self._create(
                self.worker_name(i), self.worker_template, "worker", env or {}, volumes=volumes
            )
            worker.start()
            self.workers.append(worker)

    def wait_ready(self, timeout: float = 120) -> float:
        """Wait for every worker's readiness probe (a TCP connect to its pod IP, as the kubelet
        does). Returns the seconds it took; raises TimeoutError naming the pods not ready."""
        return self.wait_pods_ready(self.workers, self.worker_template, timeout)

    def launcher_command(self) -> list[str]:
        """The template's command, with the emulator's address forwarded to the ranks by its
        ``mpirun`` (run directly or by the heartbeat watch)."""
        command = self.launcher_template.command
        return forward_emulator(command) if self.emulator is not None else list(command)

    def launcher_env(self) -> dict[str, str]:
        """What the operator adds to the launcher for Open MPI (plus the emulator's address)."""
        return {
            "OMPI_MCA_orte_keep_fqdn_hostnames": "true",
            "OMPI_MCA_orte_default_hostfile": f"{CONFIG_MOUNT}/hostfile",
            "OMPI_MCA_plm_rsh_args": "-o ConnectionAttempts=10",
            "OMPI_MCA_orte_set_default_slots": str(self.slots),
            "NVIDIA_VISIBLE_DEVICES": "",
            "NVIDIA_DRIVER_CAPABILITIES": "",
            **self.emulator_env(),
        }

    def start_launcher(self) -> Any:
        """Create and start the launcher pod (after `wait_ready`)."""
        volumes = {
            str(self.workdir / "ssh"): {"bind": self.ssh_mount, "mode": "ro"},
            str(self._config_volume()): {"bind": CONFIG_MOUNT, "mode": "ro"},
        }
        template = self.launcher_template
        launcher = self._create(
            f"{self.name}-launcher",
            PodTemplate(**{**template.__dict__, "command": self.launcher_command()}),
            "launcher",
            self.launcher_env(),
            volumes=volumes,
        )
        launcher.start()
        self.launcher = launcher
        return launcher

    def kill_worker(self, i: int) -> None:
        """SIGKILL worker pod `i`: a node lost, or a pod evicted without grace."""
        self.workers[i].kill()

    def update_discovery(self) -> None:
        """What the operator does when the running workers change: rewrite
        ``discover_hosts.sh`` in the ConfigMap, which the kubelet swaps into the launcher's
        volume at once (the real kubelet takes up to its sync period, about a minute)."""
        script = (self.discover_hosts().encode(), 0o555)
        kubelet_swap(self.workdir / "config", {"discover_hosts.sh": script}, None)

    def worker_logs(self) -> dict[str, str]:
        return {
            self.worker_name(i): w.logs().decode(errors="replace")
            for i, w in enumerate(self.workers)
        }
