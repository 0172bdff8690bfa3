"""A stand-in for the kubelet, and what the two operators' stand-ins share: a Horovod job's pods
run in Docker (`mpijob_harness`: mpi-operator; `trainjob_harness`: Kubeflow Trainer and JobSet).

There is no Kubernetes cluster here, so each harness reads the manifests the project's builder
makes (the same builder as ``render-mpijob``, ``render-trainjob`` and the train component;
nothing here holds a second copy of any command), names the pods and lays out the volumes as
its operator would, and `DockerJob` runs them as the kubelet would:

- **Network**: one internal Docker network (no route out), the GCS emulator on it as ``gcs``;
  each pod is reached by its hostname and its operator's DNS names. Docker names (containers,
  network) carry a per-run suffix, ``<pod>-<suffix>``, so two runs on one engine never clash.
- **Pods**: each runs its template's command and args as its ``runAsUser:runAsGroup`` with the
  pod's ``fsGroup`` as a supplementary group, all capabilities dropped, no privilege
  escalation, and the template's CPU and memory limits as ``--cpus``/``--memory`` (scaled down
  proportionally when this machine is smaller than the job).
- **Volumes**: the per-job SSH key (ECDSA P-521) as a Secret volume on every pod, the hostfile
  as a ConfigMap volume at ``/etc/mpi`` on the launcher, laid out as the kubelet's atomic
  writer does (`kubelet_volume`).
- **Launcher**: started once every worker passes its readiness probe (the kubelet's TCP probe),
  with the four Open MPI variables both operators set; its exit code is the job's result.
- **Teardown**: every container and the network removed, whatever the job's cleanup policy.

The one thing the harnesses add that the manifests do not say: ``STORAGE_EMULATOR_HOST``,
pointing at the emulator on the job's network. It is set on the launcher and forwarded to the
ranks with ``mpirun -x STORAGE_EMULATOR_HOST``, in place of the Workload Identity that gives the
pods GCS on GKE.
"""

from __future__ import annotations

import os
import time
import uuid
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, ClassVar, TypeVar

from kubernetes.utils import parse_quantity

RUN_LABEL = "kfp-horovod.test/run"
EMULATOR_ALIAS = "gcs"
CONFIG_MOUNT = "/etc/mpi"
_Job = TypeVar("_Job", bound="DockerJob")


@dataclass(frozen=True)
class PodTemplate:
    """What a pod template asks for: its container named `container` (else its first)."""

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
    def read(cls, template: dict[str, Any], container: str | None = None) -> PodTemplate:
        spec = template["spec"]
        named = [c for c in spec["containers"] if container is None or c["name"] == container]
        if not named:
            raise ValueError(f"the pod template has no container named {container!r}")
        c = named[0]
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
            cpus=float(parse_quantity(limits.get("cpu", "1"))),
            memory=float(parse_quantity(limits.get("memory", "1Gi"))),
            probe_port=probe.get("tcpSocket", {}).get("port"),
            probe_period=float(probe.get("periodSeconds", 2)),
        )


@dataclass
class LauncherResult:
    """How the launcher ended: its exit code (the job's result), its log and its run time."""

    exit_code: int
    log: str
    seconds: float


def ssh_key() -> tuple[bytes, bytes]:
    """A fresh ECDSA P-521 key, as mpi-operator and Trainer's MPI plugin make one per job:
    ``(private key in "EC PRIVATE KEY" PEM, public key in authorized_keys format + newline)``."""
    from cryptography.hazmat.primitives import serialization as ser
    from cryptography.hazmat.primitives.asymmetric import ec

    key = ec.generate_private_key(ec.SECP521R1())
    private = key.private_bytes(
        ser.Encoding.PEM, ser.PrivateFormat.TraditionalOpenSSL, ser.NoEncryption()
    )
    public = key.public_key().public_bytes(ser.Encoding.OpenSSH, ser.PublicFormat.OpenSSH)
    return private, public + b"\n"


def kubelet_volume(root: Path, files: dict[str, tuple[bytes, int]], group: int | None) -> Path:
    """Lay out `files` (name: content, mode) as the kubelet's atomic writer does: the data in a
    timestamped folder, ``..data`` pointing at it, one symlink per key; owned by root and the
    fsGroup `group`, which (a read-only volume) adds group read to each mode. Where `root`
    holds such a volume already, its update: new data in a new folder, then ``..data`` renamed
    over to point at it."""
    gid, update = group or 0, (root / "..data").is_symlink()
    data = root / f"..{time.strftime('%Y_%m_%d_%H_%M_%S')}.{time.time_ns() % 10**9:09d}"
    data.mkdir(parents=True)
    for name, (content, mode) in files.items():
        (data / name).write_bytes(content)
        os.chown(data / name, 0, gid)
        (data / name).chmod(mode | 0o440 if group is not None else mode)
        if not update:
            (root / name).symlink_to(f"..data/{name}")
    os.chown(data, 0, gid)
    data.chmod(0o2755 if group is not None else 0o755)
    if update:
        (root / "..data_tmp").symlink_to(data.name)
        (root / "..data_tmp").replace(root / "..data")
        return root
    (root / "..data").symlink_to(data.name)
    os.chown(root, 0, gid)
    root.chmod(0o3777 if group is not None else 0o1777)
    return root


def openmpi_env(slots: int) -> dict[str, str]:
    """What both operators set on the launcher for Open MPI."""
    return {
        "OMPI_MCA_orte_default_hostfile": f"{CONFIG_MOUNT}/hostfile",
        "OMPI_MCA_orte_keep_fqdn_hostnames": "true",
        "OMPI_MCA_orte_set_default_slots": str(slots),
        "OMPI_MCA_plm_rsh_args": "-o ConnectionAttempts=10",
    }


def forward_emulator(command: list[str]) -> list[str]:
    """`command` with ``-x STORAGE_EMULATOR_HOST`` right after its ``mpirun`` (run directly or
    by the heartbeat watch); unchanged without ``mpirun``."""
    command = list(command)
    if "mpirun" in command:
        at = command.index("mpirun") + 1
        command[at:at] = ["-x", "STORAGE_EMULATOR_HOST"]
    return command


class DockerJob:
    """One run of a job's pods: `start_workers`, `wait_ready`, `start_launcher` and
    `wait_launcher` (or `run_launcher` for the last three); a context manager that removes all
    it made. A harness sets, from its manifests: `name`, `namespace`, `slots`, `ssh_mount`,
    `worker_names`, `worker_template`, `launcher_name`, `launcher_template`, and says how its
    operator names, labels and configures pods (the methods that raise here)."""

    label: ClassVar[str]  # the Docker label naming the job, on every container and network
    ssh_modes: ClassVar[dict[str, int]]  # the SSH Secret's files and their modes
    name: str
    namespace: str
    slots: int
    ssh_mount: str
    worker_names: list[str]
    worker_template: PodTemplate
    launcher_name: str
    launcher_template: PodTemplate

    def __init__(self, docker: Any, workdir: Path, emulator: Any = None,
                 emulator_port: int = 9023) -> None:  # fmt: skip
        """`emulator` is the GCS emulator's container (joined to the job's network as ``gcs``);
        `workdir` holds the Secret and ConfigMap volumes."""
        self.docker, self.workdir = docker, workdir
        self.emulator, self.emulator_port = emulator, emulator_port
        self.suffix = uuid.uuid4().hex[:6]  # in Docker names only
        self.network: Any = None
        self.launcher: Any = None
        self.workers: list[Any] = []
        self._key = ssh_key()

    # --- what a harness says of its operator -------------------------------------------------

    def endpoint(self, pod: str) -> str:
        """The DNS name the hostfile gives pod `pod`."""
        raise NotImplementedError

    def aliases(self, pod: str) -> list[str]:
        """Every name pod `pod` is reached by on the job's network."""
        return [pod, self.endpoint(pod)]

    def hostfile_pods(self) -> list[str]:
        """The pods the hostfile lists, in its order."""
        return self.worker_names

    def pod_env(self, pod: str) -> dict[str, str]:
        """What the operator adds to pod `pod`'s environment."""
        return {}

    def pod_labels(self, pod: str) -> dict[str, str]:
        return {}

    def config_files(self) -> dict[str, tuple[bytes, int]]:
        """The launcher's ConfigMap at ``/etc/mpi``."""
        return {"hostfile": (self.hostfile().encode(), 0o444)}

    # --- names, volumes, resources -------------------------------------------------------------

    def worker_name(self, i: int) -> str:
        return self.worker_names[i]

    def hostfile(self) -> str:
        return "".join(f"{self.endpoint(p)} slots={self.slots}\n" for p in self.hostfile_pods())

    def docker_name(self, pod: str) -> str:
        """The Docker name of pod `pod`'s container in this run."""
        return f"{pod}-{self.suffix}"

    def ssh_volume(self, group: int | None) -> dict[str, dict[str, str]]:
        """The SSH Secret as the kubelet mounts it for fsGroup `group`."""
        root = self.workdir / f"ssh-{group}"
        if not root.exists():
            private, public = self._key
            files = {
                f: (private if f == "id_rsa" else public, m) for f, m in self.ssh_modes.items()
            }
            kubelet_volume(root, files, group)
        return {str(root): {"bind": self.ssh_mount, "mode": "ro"}}

    def limits(self, template: PodTemplate) -> tuple[float, int]:
        """``(--cpus, --memory bytes)`` of a pod of `template` here: the job's limits, scaled
        down alike to fit this machine when it is smaller."""
        pods = [self.worker_template] * len(self.worker_names) + [self.launcher_template]
        cpus = float(len(os.sched_getaffinity(0))) / sum(p.cpus for p in pods)
        memory = 0.8 * os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        memory /= sum(p.memory for p in pods)
        return template.cpus * min(1.0, cpus), int(template.memory * min(1.0, memory))

    # --- pods ----------------------------------------------------------------------------------

    def _create(self, pod: str, template: PodTemplate, env: dict[str, str], **kw: Any) -> Any:
        """Create (not start) pod `pod` of `template` with `env` added, hostname `pod`."""
        cpus, memory = self.limits(template)
        container = self.docker.containers.create(
            template.image, name=self.docker_name(pod), hostname=pod,
            entrypoint=template.command or None, command=template.args or None,
            environment={**template.env, **self.pod_env(pod), **env}, user=template.user,
            group_add=[str(template.fs_group)] if template.fs_group is not None else None,
            cap_drop=["ALL"], security_opt=["no-new-privileges"], nano_cpus=int(cpus * 1e9),
            mem_limit=memory, network=self.network.name,
            labels={**self.pod_labels(pod), self.label: self.name, RUN_LABEL: self.suffix},
            **kw,
        )  # fmt: skip
        self.network.disconnect(container)
        self.network.connect(container, aliases=self.aliases(pod))
        return container

    def start_workers(self, env: dict[str, str] | None = None) -> None:
        """Create the network and start every worker pod (with `env` added)."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.network = self.docker.networks.create(
            self.docker_name(self.name), driver="bridge", internal=True,
            labels={self.label: self.name, RUN_LABEL: self.suffix},
        )  # fmt: skip
        if self.emulator is not None:
            self.network.connect(self.emulator, aliases=[EMULATOR_ALIAS])
        volumes = self.ssh_volume(self.worker_template.fs_group)
        for pod in self.worker_names:
            worker = self._create(pod, self.worker_template, env or {}, volumes=volumes)
            worker.start()
            self.workers.append(worker)

    def wait_ready(self, timeout: float = 120) -> float:
        """Wait for every worker's readiness probe (a TCP connect to its pod IP on the probe's
        port, as the kubelet does). Returns the seconds it took; raises TimeoutError naming the
        pods not ready, RuntimeError if one is not running."""
        started, pending = time.monotonic(), list(self.workers)
        while pending:
            pending = [p for p in pending if not self._probe(p, self.worker_template.probe_port)]
            if pending and time.monotonic() - started > timeout:
                names = ", ".join(p.name for p in pending)
                raise TimeoutError(f"pods not ready after {timeout:g} s: {names}")
            if pending:
                time.sleep(self.worker_template.probe_period)
        return time.monotonic() - started

    def _probe(self, pod: Any, port: int | None) -> bool:
        if not running(pod):
            raise RuntimeError(f"{pod.name} is {pod.status}:\n{tail(pod)}")
        if port is None:
            return True
        ip = pod.attrs["NetworkSettings"]["Networks"][self.network.name]["IPAddress"]
        return bool(pod.exec_run(["bash", "-c", f"exec 3<>/dev/tcp/{ip}/{port}"]).exit_code == 0)

    def start_launcher(self) -> Any:
        """Create and start the launcher's pod (after `wait_ready`); its container."""
        template, env = self.launcher_template, openmpi_env(self.slots)
        if self.emulator is not None:
            template = replace(template, command=forward_emulator(template.command))
            env["STORAGE_EMULATOR_HOST"] = f"http://{EMULATOR_ALIAS}:{self.emulator_port}"
        config = kubelet_volume(self.workdir / "config", self.config_files(), template.fs_group)
        volumes = {**self.ssh_volume(template.fs_group), str(config): {"bind": CONFIG_MOUNT,
                                                                        "mode": "ro"}}  # fmt: skip
        self.launcher = self._create(self.launcher_name, template, env, volumes=volumes)
        self.launcher.start()
        return self.launcher

    def wait_launcher(self, timeout: float) -> LauncherResult:
        """Wait for the launcher to end; on timeout kill it and raise TimeoutError."""
        started = time.monotonic()
        try:
            code = self.launcher.wait(timeout=timeout)["StatusCode"]
        except Exception as exc:  # requests' ReadTimeout / ConnectionError
            self.launcher.kill()
            raise TimeoutError(
                f"launcher still running after {timeout:g} s:\n{tail(self.launcher)}"
            ) from exc
        log = self.launcher.logs(stdout=True, stderr=True).decode(errors="replace")
        return LauncherResult(int(code), log, time.monotonic() - started)

    def run_launcher(self, timeout: float = 600) -> LauncherResult:
        """Start the launcher once the workers are ready; wait for the job's result."""
        self.wait_ready()
        self.start_launcher()
        return self.wait_launcher(timeout)

    def kill_worker(self, i: int) -> None:
        """SIGKILL worker pod `i`: a node lost, or a pod evicted without grace."""
        self.workers[i].kill()

    def worker_logs(self) -> dict[str, str]:
        return {
            p: w.logs().decode(errors="replace")
            for p, w in zip(self.worker_names, self.workers, strict=False)
        }

    def close(self) -> None:
        """Remove the pods and the network."""
        for container in [*self.workers, *([self.launcher] if self.launcher else [])]:
            container.remove(force=True)
        if self.network is not None:
            if self.emulator is not None:
                self.network.disconnect(self.emulator, force=True)
            self.network.remove()

    def __enter__(self: _Job) -> _Job:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def running(container: Any) -> bool:
    container.reload()
    return bool(container.status == "running")


def tail(container: Any, lines: int = 40) -> str:
    return str(container.logs(tail=lines).decode(errors="replace"))
