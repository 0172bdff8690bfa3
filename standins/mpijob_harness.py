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
"""

from __future__ import annotations

import os
import re
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from standins.kubelet_volumes import kubelet_swap, kubelet_volume

CONFIG_MOUNT = "/etc/mpi"
LABEL = "kfp-horovod.test/mpijob"
RUN_LABEL = "kfp-horovod.test/run"
_QUANTITY = re.compile(r"^(\d+(?:\.\d+)?|\.\d+)(m|[KMGTPE]i?|k)?$")
_FACTORS = {
    None: 1.0, "m": 1e-3, "k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15,
    "E": 1e18, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60,
}  # fmt: skip


def quantity(text: str) -> float:
    """A Kubernetes quantity ('500m', '2', '4Gi') as a number."""
    match = _QUANTITY.match(str(text))
    if not match:
        raise ValueError(f"not a Kubernetes quantity: {text!r}")
    return float(match.group(1)) * _FACTORS[match.group(2)]


@dataclass(frozen=True)
class PodTemplate:
    """What a replica's pod template asks for (its first container)."""

    image: str
    command: list[str]
    args: list[str]
    env: dict[str, str]
    user: str
    fs_group: int | None
    cpus: float
    memory: float
    probe_port: int | None
    probe_period: float

    @classmethod
    def read(cls, template: dict[str, Any]) -> PodTemplate:
        spec = template["spec"]
        c = spec["containers"][0]
        sc = c.get("securityContext", {})
        limits = c.get("resources", {}).get("limits", {})
        probe = c.get("readinessProbe", {})
        return cls(
            image=c["image"],
            command=list(c.get("command", [])),
            args=list(c.get("args", [])),
            env={e["name"]: e.get("value", "") for e in c.get("env", [])},
            user=f"{sc.get('runAsUser', 0)}:{sc.get('runAsGroup', 0)}",
            fs_group=spec.get("securityContext", {}).get("fsGroup"),
            cpus=quantity(limits.get("cpu", "1")),
            memory=quantity(limits.get("memory", "1Gi")),
            probe_port=probe.get("tcpSocket", {}).get("port"),
            probe_period=float(probe.get("periodSeconds", 2)),
        )


@dataclass
class LauncherResult:
    """How the launcher ended: its exit code (the job's result), its log and its run time."""

    exit_code: int
    log: str
    seconds: float


@dataclass
class MPIJobRun:
    """One execution of an MPIJob manifest: `start_workers`, `wait_ready`, `run_launcher`.

    `emulator` is the GCS emulator container (joined to the job's network as ``gcs``);
    `workdir` holds the Secret and ConfigMap volumes. Use as a context manager: everything it
    made is removed on exit.
    """

    manifest: dict[str, Any]
    docker: Any
    workdir: Path
    emulator: Any = None
    emulator_port: int = 9023
    machine_cpus: float = field(default_factory=lambda: float(len(os.sched_getaffinity(0))))
    machine_memory: float = field(
        default_factory=lambda: float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    )
    workers: list[Any] = field(default_factory=list)
    network: Any = None
    launcher: Any = None

    def __post_init__(self) -> None:
        meta, spec = self.manifest["metadata"], self.manifest["spec"]
        self.name: str = meta["name"]
        self.namespace: str = meta.get("namespace") or "default"
        self.slots: int = int(spec.get("slotsPerWorker", 1))
        self.ssh_mount: str = spec["sshAuthMountPath"]
        replicas = spec["mpiReplicaSpecs"]
        self.worker_count = int(replicas["Worker"]["replicas"])
        self.worker_template = PodTemplate.read(replicas["Worker"]["template"])
        self.launcher_template = PodTemplate.read(replicas["Launcher"]["template"])
        self.scale = self._scale()
        self.suffix: str = uuid.uuid4().hex[:6]  # in Docker names only (see the module doc)

    # --- names, as the operator makes them ---------------------------------------------------

    def worker_name(self, i: int) -> str:
        return f"{self.name}-worker-{i}"

    def docker_name(self, pod: str) -> str:
        """The Docker name of pod `pod`'s container in this run."""
        return f"{pod}-{self.suffix}"

    def worker_fqdn(self, i: int) -> str:
        return f"{self.worker_name(i)}.{self.name}-worker.{self.namespace}.svc"

    def hostfile(self) -> str:
        return "".join(
            f"{self.worker_fqdn(i)} slots={self.slots}\n" for i in range(self.worker_count)
        )

    def discover_hosts(self) -> str:
        running = sorted(self.worker_name(i) for i, c in enumerate(self.workers) if _running(c))
        service = f"{self.name}-worker.{self.namespace}.svc"
        return "#!/bin/sh\n" + "".join(f"echo {pod}.{service}\n" for pod in running)

    # --- resources ---------------------------------------------------------------------------

    def _scale(self) -> tuple[float, float]:
        """CPU and memory factors (<= 1) that fit every pod of the job on this machine."""
        pods = [self.worker_template] * self.worker_count + [self.launcher_template]
        cpus = sum(p.cpus for p in pods)
        memory = sum(p.memory for p in pods)
        return min(1.0, self.machine_cpus / cpus), min(1.0, 0.8 * self.machine_memory / memory)

    def limits(self, template: PodTemplate) -> tuple[float, int]:
        """``(--cpus, --memory bytes)`` of a pod of `template` here."""
        return template.cpus * self.scale[0], int(template.memory * self.scale[1])

    # --- volumes -----------------------------------------------------------------------------

    def _secret_volume(self) -> Path:
        """The ``<job>-ssh`` Secret as the kubelet mounts it (no defaultMode, with fsGroup)."""
        from cryptography.hazmat.primitives import serialization as ser
        from cryptography.hazmat.primitives.asymmetric import ec

        key = ec.generate_private_key(ec.SECP521R1())
        private = key.private_bytes(
            ser.Encoding.PEM, ser.PrivateFormat.TraditionalOpenSSL, ser.NoEncryption()
        )
        public = key.public_key().public_bytes(ser.Encoding.OpenSSH, ser.PublicFormat.OpenSSH)
        files = {
            "id_rsa": (private, 0o644),
            "id_rsa.pub": (public + b"\n", 0o644),
            "authorized_keys": (public + b"\n", 0o644),
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
        cpus, memory = self.limits(template)
        container = self.docker.containers.create(
            template.image,
            name=self.docker_name(name),
            hostname=name,
            entrypoint=template.command or None,
            command=template.args or None,
            environment={**template.env, **env, "K_MPI_JOB_ROLE": role},
            user=template.user,
            group_add=[str(template.fs_group)] if template.fs_group is not None else None,
            cap_drop=["ALL"],
            security_opt=["no-new-privileges"],
            nano_cpus=int(cpus * 1e9),
            mem_limit=memory,
            labels={LABEL: self.name, RUN_LABEL: self.suffix},
            network=self.network.name,
            **kw,
        )
        aliases = [name, f"{name}.{self.name}-worker.{self.namespace}.svc"]
        self.network.disconnect(container)
        self.network.connect(container, aliases=aliases)
        return container

    def start_workers(self, env: dict[str, str] | None = None) -> None:
        """Create the network and the Secret, and start every worker pod."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.network = self.docker.networks.create(
            self.docker_name(self.name), driver="bridge", internal=True,
            labels={LABEL: self.name, RUN_LABEL: self.suffix},
        )  # fmt: skip
        if self.emulator is not None:
            self.network.connect(self.emulator, aliases=["gcs"])
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
        started = time.monotonic()
        port = self.worker_template.probe_port
        pending = list(self.workers)
        while pending:
            pending = [w for w in pending if not self._probe(w, port)]
            if pending and time.monotonic() - started > timeout:
                names = ", ".join(w.name for w in pending)
                raise TimeoutError(f"workers not ready after {timeout:g} s: {names}")
            if pending:
                time.sleep(self.worker_template.probe_period)
        return time.monotonic() - started

    def _probe(self, worker: Any, port: int | None) -> bool:
        worker.reload()
        if worker.status != "running":
            raise RuntimeError(f"{worker.name} is {worker.status}:\n{_tail(worker)}")
        if port is None:
            return True
        ip = worker.attrs["NetworkSettings"]["Networks"][self.network.name]["IPAddress"]
        probe = f"exec 3<>/dev/tcp/{ip}/{port}"
        return bool(worker.exec_run(["bash", "-c", probe]).exit_code == 0)

    def launcher_command(self) -> list[str]:
        """The template's command, with the emulator's address forwarded to the ranks by its
        ``mpirun`` (run directly or by the heartbeat watch)."""
        command = list(self.launcher_template.command)
        if self.emulator is not None and "mpirun" in command:
            at = command.index("mpirun") + 1
            command[at:at] = ["-x", "STORAGE_EMULATOR_HOST"]
        return command

    def launcher_env(self) -> dict[str, str]:
        """What the operator adds to the launcher for Open MPI (plus the emulator's address)."""
        env = {
            "OMPI_MCA_orte_keep_fqdn_hostnames": "true",
            "OMPI_MCA_orte_default_hostfile": f"{CONFIG_MOUNT}/hostfile",
            "OMPI_MCA_plm_rsh_args": "-o ConnectionAttempts=10",
            "OMPI_MCA_orte_set_default_slots": str(self.slots),
            "NVIDIA_VISIBLE_DEVICES": "",
            "NVIDIA_DRIVER_CAPABILITIES": "",
        }
        if self.emulator is not None:
            env["STORAGE_EMULATOR_HOST"] = f"http://gcs:{self.emulator_port}"
        return env

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

    def wait_launcher(self, timeout: float) -> LauncherResult:
        """Wait for the launcher to end; on timeout kill it and raise TimeoutError."""
        started = time.monotonic()
        try:
            code = self.launcher.wait(timeout=timeout)["StatusCode"]
        except Exception as exc:  # requests' ReadTimeout / ConnectionError
            self.launcher.kill()
            raise TimeoutError(
                f"launcher still running after {timeout:g} s:\n{_tail(self.launcher)}"
            ) from exc
        log = self.launcher.logs(stdout=True, stderr=True).decode(errors="replace")
        return LauncherResult(int(code), log, time.monotonic() - started)

    def run_launcher(self, timeout: float = 600) -> LauncherResult:
        """Start the launcher once the workers are ready, and wait for the job's result."""
        self.wait_ready()
        self.start_launcher()
        return self.wait_launcher(timeout)

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

    def close(self) -> None:
        """Remove the pods and the network (cleanPodPolicy: everything, here)."""
        for container in [*self.workers, self.launcher]:
            if container is not None:
                container.remove(force=True)
        if self.network is not None:
            if self.emulator is not None:
                self.network.disconnect(self.emulator, force=True)
            self.network.remove()

    def __enter__(self) -> MPIJobRun:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _running(container: Any) -> bool:
    container.reload()
    return bool(container.status == "running")


def _tail(container: Any, lines: int = 40) -> str:
    return str(container.logs(tail=lines).decode(errors="replace"))
