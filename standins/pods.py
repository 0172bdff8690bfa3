"""A job's pods in Docker, as the kubelet runs them: what the stand-ins of the operators that
make the pods share (`mpijob_harness`: mpi-operator; `trainjob_harness`: Kubeflow Trainer and
JobSet).

- `PodTemplate`: what a pod template's container asks for, as Docker is told it.
- `DockerPods`: a job's pods as containers on one internal Docker network, the GCS emulator on
  it as ``gcs``. Each pod runs its template's command and args as its ``runAsUser:runAsGroup``
  with the pod's ``fsGroup`` as a supplementary group, all capabilities dropped, no privilege
  escalation, and the template's CPU and memory limits as ``--cpus``/``--memory`` (scaled down
  proportionally when this machine is smaller than the job). Readiness is the kubelet's TCP
  probe; the launcher's exit code is the job's result.
- Docker names (containers, network) carry a per-run suffix, ``<pod>-<suffix>``, so that two
  runs on one engine never clash; hostnames and network aliases keep the operators' names.
- `ssh_key`: the per-job ECDSA P-521 key both operators put in the job's SSH Secret.
- `forward_emulator`: the one thing the harnesses add to a launcher's command.
"""

from __future__ import annotations

import os
import re
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, TypeVar

RUN_LABEL = "kfp-horovod.test/run"
EMULATOR_ALIAS = "gcs"
_QUANTITY = re.compile(r"^(\d+(?:\.\d+)?|\.\d+)(m|[KMGTPE]i?|k)?$")
_FACTORS = {
    None: 1.0, "m": 1e-3, "k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15,
    "E": 1e18, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60,
}  # fmt: skip
_Pods = TypeVar("_Pods", bound="DockerPods")


def quantity(text: str) -> float:
    """A Kubernetes quantity ('500m', '2', '4Gi') as a number."""
    match = _QUANTITY.match(str(text))
    if not match:
        raise ValueError(f"not a Kubernetes quantity: {text!r}")
    return float(match.group(1)) * _FACTORS[match.group(2)]


def machine_cpus() -> float:
    """The cores this process may use."""
    return float(len(os.sched_getaffinity(0)))


def machine_memory() -> float:
    """This machine's memory in bytes."""
    return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


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


def forward_emulator(command: list[str]) -> list[str]:
    """`command` with ``-x STORAGE_EMULATOR_HOST`` right after its ``mpirun`` (run directly or
    by the heartbeat watch), so the ranks reach the emulator; unchanged without ``mpirun``."""
    command = list(command)
    if "mpirun" in command:
        at = command.index("mpirun") + 1
        command[at:at] = ["-x", "STORAGE_EMULATOR_HOST"]
    return command


class DockerPods:
    """The Docker side of one job's pods. A harness (a dataclass) provides the attributes
    below, `containers`, `wait_ready` and `start_launcher`; `close` (and leaving the ``with``
    block) removes all it made."""

    label: ClassVar[str]  # the Docker label naming the job, on every container and network
    name: str
    docker: Any
    workdir: Path
    emulator: Any
    emulator_port: int
    machine_cpus: float
    machine_memory: float
    network: Any
    launcher: Any
    suffix: str
    scale: tuple[float, float]

    def containers(self) -> list[Any]:
        """Every pod's container made so far."""
        raise NotImplementedError

    def wait_ready(self, timeout: float = 120) -> float:
        """Wait until the pods the launcher waits for are ready; the seconds it took."""
        raise NotImplementedError

    def start_launcher(self) -> Any:
        """Create and start the launcher's pod (after `wait_ready`); its container."""
        raise NotImplementedError

    def run_launcher(self, timeout: float = 600) -> LauncherResult:
        """Start the launcher once the pods it waits for are ready, and wait for the job's
        result."""
        self.wait_ready()
        self.start_launcher()
        return self.wait_launcher(timeout)

    @staticmethod
    def new_suffix() -> str:
        return uuid.uuid4().hex[:6]

    def docker_name(self, pod: str) -> str:
        """The Docker name of pod `pod`'s container in this run."""
        return f"{pod}-{self.suffix}"

    def docker_labels(self) -> dict[str, str]:
        return {self.label: self.name, RUN_LABEL: self.suffix}

    # --- resources ---------------------------------------------------------------------------

    def fit(self, pods: list[PodTemplate]) -> tuple[float, float]:
        """CPU and memory factors (<= 1) that fit all of `pods` on this machine."""
        cpus = sum(p.cpus for p in pods)
        memory = sum(p.memory for p in pods)
        return min(1.0, self.machine_cpus / cpus), min(1.0, 0.8 * self.machine_memory / memory)

    def limits(self, template: PodTemplate) -> tuple[float, int]:
        """``(--cpus, --memory bytes)`` of a pod of `template` here."""
        return template.cpus * self.scale[0], int(template.memory * self.scale[1])

    # --- network and pods --------------------------------------------------------------------

    def open_network(self) -> None:
        """Create the job's internal network, with the emulator on it as ``gcs``."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.network = self.docker.networks.create(
            self.docker_name(self.name), driver="bridge", internal=True,
            labels=self.docker_labels(),
        )  # fmt: skip
        if self.emulator is not None:
            self.network.connect(self.emulator, aliases=[EMULATOR_ALIAS])

    def emulator_env(self) -> dict[str, str]:
        """The emulator's address for the launcher (nothing without an emulator)."""
        if self.emulator is None:
            return {}
        return {"STORAGE_EMULATOR_HOST": f"http://{EMULATOR_ALIAS}:{self.emulator_port}"}

    def create_pod(
        self,
        pod: str,
        template: PodTemplate,
        env: dict[str, str],
        aliases: list[str],
        labels: dict[str, str] | None = None,
        **kw: Any,
    ) -> Any:
        """Create (not start) pod `pod` of `template` with `env` added, hostname `pod`, reached
        on the job's network as each of `aliases`."""
        cpus, memory = self.limits(template)
        container = self.docker.containers.create(
            template.image,
            name=self.docker_name(pod),
            hostname=pod,
            entrypoint=template.command or None,
            command=template.args or None,
            environment={**template.env, **env},
            user=template.user,
            group_add=[str(template.fs_group)] if template.fs_group is not None else None,
            cap_drop=["ALL"],
            security_opt=["no-new-privileges"],
            nano_cpus=int(cpus * 1e9),
            mem_limit=memory,
            labels={**(labels or {}), **self.docker_labels()},
            network=self.network.name,
            **kw,
        )
        self.network.disconnect(container)
        self.network.connect(container, aliases=aliases)
        return container

    def wait_pods_ready(self, pods: list[Any], template: PodTemplate, timeout: float) -> float:
        """Wait for each of `pods`' readiness probe (a TCP connect to its pod IP on the port of
        `template`'s probe, as the kubelet does). Returns the seconds it took; raises
        TimeoutError naming the pods not ready, RuntimeError if one is not running."""
        started = time.monotonic()
        pending = list(pods)
        while pending:
            pending = [p for p in pending if not self._probe(p, template.probe_port)]
            if pending and time.monotonic() - started > timeout:
                names = ", ".join(p.name for p in pending)
                raise TimeoutError(f"pods not ready after {timeout:g} s: {names}")
            if pending:
                time.sleep(template.probe_period)
        return time.monotonic() - started

    def _probe(self, pod: Any, port: int | None) -> bool:
        pod.reload()
        if pod.status != "running":
            raise RuntimeError(f"{pod.name} is {pod.status}:\n{tail(pod)}")
        if port is None:
            return True
        ip = pod.attrs["NetworkSettings"]["Networks"][self.network.name]["IPAddress"]
        probe = f"exec 3<>/dev/tcp/{ip}/{port}"
        return bool(pod.exec_run(["bash", "-c", probe]).exit_code == 0)

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

    def close(self) -> None:
        """Remove the pods and the network (everything, whatever the job's cleanup policy)."""
        for container in self.containers():
            container.remove(force=True)
        if self.network is not None:
            if self.emulator is not None:
                self.network.disconnect(self.emulator, force=True)
            self.network.remove()

    def __enter__(self: _Pods) -> _Pods:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def running(container: Any) -> bool:
    container.reload()
    return bool(container.status == "running")


def tail(container: Any, lines: int = 40) -> str:
    return str(container.logs(tail=lines).decode(errors="replace"))
