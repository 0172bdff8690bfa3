"""A Kubernetes API for the MPIJob backend on this machine: kmock's emulator, served over HTTP.

Used by the MPIJob lifecycle tests and by the fault benchmark (bench/faults.py), with the real
``kubernetes`` client. What kmock cannot emulate is played here, and said so:

* mpi-operator: an `Operator` thread moves the job's conditions by patching its status through
  the API and creates the launcher pod, as the controller would;
* pod logs: kmock has no kubelet, so a reaction serves ``pods/<name>/log`` from a dict the
  operator thread appends to;
* garbage collection: kmock does not cascade deletes, so an `Operator` deletes the job's pods
  once the job is gone, as Kubernetes' garbage collector would;
* kmock ignores label selectors, so an unrelated pod is always present to prove that the code
  filters pods itself.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any

import kmock
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from components.train.mpijob.manifest import LABEL_JOB, LABEL_ROLE

NS = "kubeflow-user"
G, V, P = "kubeflow.org", "v2beta1", "mpijobs"


class Cluster:
    """kmock's KubernetesEmulator served on a local port; `api` is a real kubernetes client."""

    def __init__(self) -> None:
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
        self.emu.resources["kubeflow.org/v2beta1/mpijobs"] = kmock.ResourceInfo()
        self.emu.resources["v1/pods"] = kmock.ResourceInfo()
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

    def join(self) -> None:
        assert self._thread is not None
        self._thread.join(30)
        if self.error:
            raise self.error
