"""A Kubernetes API for the cluster backends on this machine: kmock's emulator, served over HTTP.

Used by the MPIJob and TrainJob lifecycle tests and by the fault benchmark (bench/faults/), with
the real ``kubernetes`` client. The cluster serves the MPIJob, TrainJob and TrainingRuntime APIs
(discovery included), or the ones a test names. What kmock cannot emulate is played here, and
said so:

* mpi-operator: an `Operator` thread moves the job's conditions by patching its status through
  the API and creates the launcher pod, as the controller would;
* pod logs: kmock has no kubelet, so a reaction serves ``pods/<name>/log`` from a dict the
  operator thread appends to;
* garbage collection: kmock does not cascade deletes, so an `Operator` deletes the job's pods
  once the job is gone, as Kubernetes' garbage collector would;
* the pods themselves: `TrainerOperator` runs the launcher's trainer command line with
  horovodrun on this machine instead of mpirun across pods (and without the heartbeat watch);
* kmock ignores label selectors, so an unrelated pod is always present to prove that the code
  filters pods itself.
"""

from __future__ import annotations

import asyncio
import subprocess
import threading
import time
from collections.abc import Callable
from typing import Any

import kmock
import psutil
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from components.train.cluster.crd import Crd
from components.train.mpijob.manifest import LABEL_JOB, LABEL_ROLE
from components.train.mpijob.validate import MPIJOB
from components.train.rankwatch import rank_processes
from components.train.trainjob.manifest import TRAINING_RUNTIME, TRAINJOB

NS = "kubeflow-user"
G, V, P = "kubeflow.org", "v2beta1", "mpijobs"


class Cluster:
    """kmock's KubernetesEmulator served on a local port; `api` is a real kubernetes client.

    It serves the APIs of `kinds` (default: MPIJob, TrainJob and TrainingRuntime), as a cluster
    with those CRDs installed would."""

    def __init__(self, kinds: tuple[Crd, ...] = (MPIJOB, TRAINJOB, TRAINING_RUNTIME)) -> None:
        self.kinds = kinds
        self.emu = kmock.KubernetesEmulator()
        self.logs: dict[str, str] = {}  # launcher log per pod name, served by a reaction
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self.url = ""
        self._thread = threading.Thread(target=lambda: asyncio.run(self._serve()), daemon=True)

    async def _serve(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        async with self.emu, kmock.Server(self.emu) as server:
            self.url = str(server.url).rstrip("/")
            self._ready.set()
            await self._stop.wait()

    def __enter__(self) -> Cluster:
        self._thread.start()
        assert self._ready.wait(10), "kmock did not start"
        for crd in self.kinds:
            self.emu.resources[f"{crd.api_version}/{crd.plural}"] = kmock.ResourceInfo(
                namespaced=True, kind=crd.kind, verbs={"create", "get", "list", "delete", "patch"},
                subresources={"status"},
            )  # fmt: skip
        self.emu.resources["v1/pods"] = kmock.ResourceInfo(namespaced=True, kind="Pod")
        self.emu["get", kmock.subresource("log")] << (
            lambda request: self.logs.get(request.name, "").encode()
        )
        config = client.Configuration()
        config.host = self.url
        self.api = client.ApiClient(config)
        self.custom = client.CustomObjectsApi(self.api)
        self.core = client.CoreV1Api(self.api)
        # an unrelated pod: kmock ignores label selectors, the code must not
        self.core.create_namespaced_pod(NS, pod("unrelated", {"app": "other"}))
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._loop is not None and self._stop is not None
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)

    def requests(self, method: str, path_part: str) -> list[Any]:
        return [r for r in list(self.emu) if r.method.value == method and path_part in str(r.url)]

    def job(self, name: str) -> dict[str, Any] | None:
        try:
            return dict(self.custom.get_namespaced_custom_object(G, V, NS, P, name))
        except ApiException as exc:
            assert exc.status == 404
            return None

    def job_names(self) -> list[str]:
        items = self.custom.list_namespaced_custom_object(G, V, NS, P)["items"]
        return [i["metadata"]["name"] for i in items]

    def pod_names(self) -> list[str]:
        return sorted(p.metadata.name for p in self.core.list_namespaced_pod(NS).items)


def pod(name: str, labels: dict[str, str], uid: str = "", reason: str | None = None) -> dict:
    body: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NS, "labels": labels},
        "spec": {"containers": [{"name": "launcher", "image": "x"}]},
    }
    if uid:
        body["metadata"]["uid"] = uid
    if reason:
        body["status"] = {"phase": "Failed", "reason": reason}
    return body


class Operator:
    """Plays mpi-operator (and the garbage collector) through the API, in a thread."""

    def __init__(self, cluster: Cluster) -> None:
        self.c = cluster
        self.error: BaseException | None = None
        self._thread: threading.Thread | None = None

    def wait_for_job(self, timeout: float = 10.0) -> str:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            names = self.c.job_names()
            if names:
                return str(names[0])
            time.sleep(0.02)
        raise AssertionError("the code under test created no MPIJob")

    def conditions(self, name: str, *conds: tuple[str, str, str]) -> None:
        """Set status.conditions to (type, reason, message) entries, all True."""
        body = {
            "status": {
                "conditions": [
                    {"type": t, "status": "True", "reason": r, "message": m} for t, r, m in conds
                ]
            }
        }
        self.c.custom.patch_namespaced_custom_object_status(G, V, NS, P, name, body)

    def launcher(self, name: str, reason: str | None = None) -> str:
        pod_name = f"{name}-launcher-x7k2p"
        labels = {LABEL_JOB: name, LABEL_ROLE: "launcher"}
        self.c.logs[pod_name] = ""
        self.c.core.create_namespaced_pod(NS, pod(pod_name, labels, reason=reason))
        self.c.core.create_namespaced_pod(
            NS, pod(f"{name}-worker-0", {LABEL_JOB: name, LABEL_ROLE: "worker"})
        )
        return pod_name

    def say(self, pod_name: str, *lines: str) -> None:
        self.c.logs[pod_name] += "".join(line + "\n" for line in lines)

    def play(self, script: Callable[[Operator], None]) -> None:
        def run() -> None:
            try:
                script(self)
            except BaseException as exc:  # surfaced by join()
                self.error = exc

        self._thread = threading.Thread(target=run, daemon=True)
        self._thread.start()

    def join(self, timeout: float = 30.0) -> None:
        assert self._thread is not None
        self._thread.join(timeout)
        if self.error:
            raise self.error


def launcher_command(job: dict[str, Any]) -> list[str]:
    """The launcher container's command in a stored MPIJob."""
    launcher = job["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]
    return list(launcher["containers"][0]["command"])


def local_equivalent(command: list[str]) -> tuple[int, list[str], dict[str, str]]:
    """``[mpiwatch ... --] mpirun -np N ... -x K=V ... python -m components.train ARGS`` as
    ``(N, ARGS, {K: V})``. The heartbeat period is left out: the heartbeat watch
    (`components.train.mpiwatch`) is not run here, so nothing would take the beats out."""
    from components.train.heartbeat import HEARTBEAT_ENV

    command = command[command.index("mpirun") :]
    exported = [command[i + 1] for i, word in enumerate(command[:-1]) if word == "-x"]
    module = command.index("components.train")
    env = dict(item.split("=", 1) for item in exported if "=" in item)
    env.pop(HEARTBEAT_ENV, None)
    return int(command[command.index("-np") + 1]), command[module + 1 :], env


class TrainerOperator(Operator):
    """Plays mpi-operator, the kubelet and the garbage collector for one MPIJob at a time, with
    the real trainer: the launcher is the command line the stored MPIJob holds, run by
    horovodrun on this machine (`launch.local_command`, the same ranks and arguments, the
    ``-x`` environment plus `env`), its output the launcher pod's log. When the MPIJob is
    deleted while it runs, the ranks are killed and the pods deleted, as Kubernetes would.
    """

    def __init__(self, cluster: Cluster, env: dict[str, str]) -> None:
        super().__init__(cluster)
        self.env = env
        self.starts = 0  # trainer launches, over every job served
        self.collected: list[int] = []  # pids of the ranks killed when a job was deleted
        self.lines: list[tuple[float, str]] = []  # every launcher line, with when it came
        self.killed_at: float | None = None  # when the ranks of a deleted job were killed

    def serve(self, name: str, poll_s: float = 0.1) -> int | None:
        """Run MPIJob `name` to its end: the trainer's exit code, or None if it was deleted."""
        from components.train.launch import job_environment, local_command

        job = self.c.job(name)
        assert job is not None, f"no MPIJob {name}"
        workers, args, exported = local_equivalent(launcher_command(job))
        self.conditions(name, ("Created", "MPIJobCreated", "MPIJob created"))
        pod_name = self.launcher(name)
        running = ("Running", "MPIJobRunning", "launcher is running")
        self.conditions(name, ("Created", "MPIJobCreated", ""), running)
        proc = subprocess.Popen(
            local_command(workers, args), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True, env=job_environment({**self.env, **exported}), start_new_session=True,
        )  # fmt: skip
        self.starts += 1
        reader = threading.Thread(target=self._pump, args=(proc, pod_name), daemon=True)
        reader.start()
        while proc.poll() is None:
            if self.c.job(name) is None:
                self._collect(name, proc)
                return None
            time.sleep(poll_s)
        reader.join()
        code = proc.returncode
        done = (
            ("Succeeded", "MPIJobSucceeded", "")
            if code == 0
            else ("Failed", "Error", f"exit {code}")
        )
        self.conditions(name, ("Created", "MPIJobCreated", ""), running, done)
        return code

    def _pump(self, proc: subprocess.Popen[str], pod_name: str) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            self.lines.append((time.monotonic(), line.rstrip("\n")))
            self.say(pod_name, line.rstrip("\n"))

    def _collect(self, name: str, proc: subprocess.Popen[str]) -> None:
        """The garbage collector's part: the job's containers are killed, its pods deleted."""
        from components.train.launch import kill_job

        ranks = list(rank_processes(proc.pid).values())
        self.killed_at = time.monotonic()
        kill_job(proc.pid)
        psutil.wait_procs(ranks, timeout=30)
        proc.wait()
        self.collected += [r.pid for r in ranks]
        for pod_name in self.c.pod_names():
            if pod_name.startswith(f"{name}-"):
                self.c.core.delete_namespaced_pod(pod_name, NS)
