"""A Kubernetes API for the cluster backends on this machine: kmock's emulator, served over HTTP.

Used by the MPIJob and TrainJob lifecycle tests, the pipeline's train step test and the fault
benchmark (bench/faults/), with the real ``kubernetes`` client. The cluster serves the MPIJob,
TrainJob and TrainingRuntime APIs (discovery included), or the ones a test names, with the CRDs
of mpi-operator and of a Kubeflow Trainer release (v2.3.0 unless a test names another). What
kmock cannot emulate is played here, and said so:

* the API server's pruning of custom resources, its ``fieldValidation=Strict`` and its OpenAPI
  v3 documents: `standins.kmock_api`, which stands in for the API server there;
* the controllers: an `Operator` thread plays the controller of one `Kind` of job
  (`standins.kmock_jobs`: `MPIJOB_KIND` for mpi-operator, `TRAINJOB_KIND` for Kubeflow Trainer
  v2.3 with JobSet, whose docstring says how each shows), moving its conditions by patching its
  status through the API and creating its pods from their templates' specs, as the
  controllers do, so that each carries its template's placement;
* pod logs and the launcher's end: kmock has no kubelet, so a reaction serves
  ``pods/<name>/log`` from a dict the operator thread appends to, for the pod's launcher
  container only; with ``follow`` true it streams, as the kubelet does, until the container
  ends: `Operator.end` marks the launcher pod Succeeded or Failed (its container terminated),
  then ends the stream; deleting the pod ends it too;
* garbage collection: kmock does not cascade deletes, so `Operator.collect` deletes the job's
  pods once the job is gone, as Kubernetes' garbage collector would;
* the pods themselves: `TrainerOperator` runs the launcher's trainer command line on this
  machine (`launch.local_command`) instead of mpirun across pods (without the heartbeat watch);
  where a test trains nothing, `Operator.write_outputs` leaves a placeholder of rank 0's
  outputs that claims no training outcome (`standins.kmock_jobs.write_rank0_outputs`);
* kmock ignores label selectors, so an unrelated pod is always present to prove that the code
  filters pods itself.
"""

from __future__ import annotations

import asyncio
import subprocess
import threading
import time
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

import kmock
import psutil
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from components.common.crd import Crd
from components.train.config import TrainConfig
from components.train.launcher.cluster.mpijob import MPIJOB
from components.train.launcher.cluster.trainjob import TRAINING_RUNTIME, TRAINJOB
from standins.commands import rank_processes
from standins.kmock_api import Emulator, Schema, served_schemas
from standins.kmock_jobs import (
    MPIJOB_KIND,
    TRAINJOB_KIND,
    Condition,
    Kind,
    local_equivalent,
    write_rank0_outputs,
)
from standins.waiting import HANG_S, Background, join, wait_until

__all__ = [
    "MPIJOB_KIND", "NS", "TRAINJOB_KIND", "Cluster", "Kind", "Operator", "TrainerOperator",
    "local_equivalent", "pod", "write_rank0_outputs",
]  # fmt: skip

NS = "kubeflow-user"
GO_TRUE = ("1", "t", "T", "TRUE", "true", "True")  # the API server's booleans (strconv.ParseBool)
G, V, P = MPIJOB.group, MPIJOB.version, MPIJOB.plural


class Cluster:
    """kmock's KubernetesEmulator served on a local port; `api` is a real kubernetes client.

    It serves the APIs of `kinds` (default: MPIJob, TrainJob and TrainingRuntime), as a cluster
    with those CRDs installed would: Kubeflow Trainer's of release `trainer` (default: the one
    the project builds against), or a test's own `schemas` of some."""

    def __init__(
        self, kinds: tuple[Crd, ...] = (MPIJOB, TRAINJOB, TRAINING_RUNTIME),
        trainer: str | None = None, schemas: Mapping[Crd, Schema] | None = None,
    ) -> None:  # fmt: skip
        self.kinds = kinds
        self.emu = Emulator()
        self.schemas = {**served_schemas(kinds, trainer), **(schemas or {})}
        self.logs: dict[str, str] = {}  # launcher log per pod name, served by a reaction
        self.log_containers: dict[str, str] = {}  # the container that log is of, per pod
        self.ended: set[str] = set()  # pods whose launcher container ended (its log is whole)
        self.closing, self.streams_ended = False, 0
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
        assert self._ready.wait(HANG_S), "kmock did not start"
        self.emu.serve(self.schemas)
        self.emu.resources["v1/pods"] = kmock.ResourceInfo(
            namespaced=True, kind="Pod", subresources={"status", "log"}
        )
        self.emu["get", kmock.subresource("log")] << self._log
        config = client.Configuration()
        config.host = self.url
        self.api = client.ApiClient(config)
        self.custom = client.CustomObjectsApi(self.api)
        self.core = client.CoreV1Api(self.api)
        # an unrelated pod: kmock ignores label selectors, the code must not
        self.core.create_namespaced_pod(NS, pod("unrelated", {"app": "other"}))
        return self

    def _log(self, request: kmock.Request) -> Any:
        """A pod's log, streamed until its container ends with ``follow=true``; empty for a
        container other than the launcher's (or for none named)."""
        name = str(request.name)
        if request.params.get("container") != self.log_containers.get(name):
            return b""
        if request.params.get("follow") in GO_TRUE:
            return self._follow(name)
        return self.logs.get(name, "").encode()

    def end_log_streams(self) -> None:
        """End every open log stream while the containers run on, as the API server may end a
        long request (its clients must open it again)."""
        self.streams_ended += 1

    async def _follow(self, name: str) -> AsyncIterator[bytes]:
        yield b""  # the response starts at once, as the kubelet's
        sent, generation = 0, self.streams_ended
        while True:
            ended = name in self.ended or self.closing  # before the text: all of it is there
            ended = ended or self.streams_ended != generation
            text = self.logs.get(name, "")
            if len(text) > sent:
                yield text[sent:].encode()
                sent = len(text)
            if ended:
                return
            await asyncio.sleep(0.01)

    def __exit__(self, *exc: object) -> None:
        assert self._loop is not None and self._stop is not None
        self.closing = True
        self._loop.call_soon_threadsafe(self._stop.set)
        join(self._thread, "kmock's server")

    def requests(self, method: str, path_part: str) -> list[Any]:
        return [r for r in list(self.emu) if r.method.value == method and path_part in str(r.url)]

    def job(self, name: str, crd: Crd = MPIJOB) -> dict[str, Any] | None:
        """The stored object `name` of `crd`'s kind (an MPIJob unless named), or None."""
        try:
            return dict(
                self.custom.get_namespaced_custom_object(
                    crd.group, crd.version, NS, crd.plural, name
                )
            )
        except ApiException as exc:
            assert exc.status == 404
            return None

    def job_names(self, crd: Crd = MPIJOB) -> list[str]:
        """The names of the stored objects of `crd`'s kind (MPIJobs unless named)."""
        items = self.custom.list_namespaced_custom_object(crd.group, crd.version, NS, crd.plural)
        return [i["metadata"]["name"] for i in items["items"]]

    def pod_names(self) -> list[str]:
        return sorted(p.metadata.name for p in self.core.list_namespaced_pod(NS).items)


def pod(
    name: str, labels: dict[str, str], uid: str = "", container: str = "launcher",
    template: dict[str, Any] | None = None,
) -> dict:  # fmt: skip
    """A pod `name`; made from a pod `template` spec if given, else of one `container`."""
    spec = dict(template) if template else {"containers": [{"name": container, "image": "x"}]}
    body: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NS, "labels": labels},
        "spec": spec,
    }
    if uid:
        body["metadata"]["uid"] = uid
    return body


class Operator:
    """Plays the controller of `kind`'s jobs (and the garbage collector) through the API, in
    a thread."""

    def __init__(self, cluster: Cluster, kind: Kind = MPIJOB_KIND) -> None:
        self.c = cluster
        self.kind = kind
        self.launchers: dict[str, str] = {}  # each job's launcher pod
        self._script: Background | None = None

    def wait_for_job(self, name: str | None = None) -> str:
        """The name of the first job of our kind there is, or of job `name` once it is there
        (`standins.waiting`: however long the code under test takes, short of a hang)."""

        def created() -> str | None:
            names = self.c.job_names(self.kind.crd)
            return (name or str(names[0])) if names and (name is None or name in names) else None

        job = f"{self.kind.crd.kind} {name}" if name else f"a {self.kind.crd.kind}"
        return wait_until(created, f"{job} created by the code under test")

    def job(self, name: str) -> dict[str, Any]:
        job = self.c.job(name, self.kind.crd)
        assert job is not None, f"no {self.kind.crd.kind} {name}"
        return job

    def conditions(self, name: str, *conds: Condition) -> None:
        """Set status.conditions to (type, reason, message) entries, all True."""
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        conditions = [
            {"type": t, "status": "True", "reason": r, "message": m, "lastTransitionTime": now}
            for t, r, m in conds
        ]
        crd = self.kind.crd
        self.c.custom.patch_namespaced_custom_object_status(
            crd.group, crd.version, NS, crd.plural, name, {"status": {"conditions": conditions}}
        )

    def launcher(self, name: str) -> str:
        """Create the job's pods; return the launcher pod's name."""
        pods = self.kind.pods(self.c.job, self.job(name))
        for i, (pod_name, labels, container, template) in enumerate(pods):
            if i == 0:
                self.c.logs[pod_name], self.c.log_containers[pod_name] = "", container
                self.launchers[name] = pod_name
            body = pod(pod_name, labels, container=container, template=template)
            self.c.core.create_namespaced_pod(NS, body)
        if self.kind.jobs_status is not None:
            crd, status = self.kind.crd, {"jobsStatus": self.kind.jobs_status(pods)}
            self.c.custom.patch_namespaced_custom_object_status(
                crd.group, crd.version, NS, crd.plural, name, {"status": status}
            )
        return pods[0][0]

    def say(self, pod_name: str, *lines: str) -> None:
        self.c.logs[pod_name] += "".join(line + "\n" for line in lines)

    def start(self, name: str) -> str:
        """The job starts: its first condition, its pods, its running conditions; returns the
        launcher pod's name."""
        if self.kind.running:
            self.conditions(name, self.kind.running[0])
        pod_name = self.launcher(name)
        if self.kind.running:
            self.conditions(name, *self.kind.running)
        return pod_name

    def end(self, name: str, code: int, reason: str | None = None) -> None:
        """Job `name`'s launcher container exits with `code` (its pod Failed for `reason`, if
        given, as an evicted pod): the kubelet marks the pod, then its log stream ends."""
        pod_name = self.launchers.get(name)
        if pod_name is None:
            return
        phase = "Succeeded" if code == 0 and not reason else "Failed"
        state = {"terminated": {"exitCode": code, "reason": reason or "Completed"}}
        status = {"phase": phase, "reason": reason, "containerStatuses": [
            {"name": self.c.log_containers[pod_name], "state": state, "restartCount": 0,
             "ready": False, "image": "x", "imageID": ""},
        ]}  # fmt: skip
        self.c.core.patch_namespaced_pod_status(pod_name, NS, {"status": status})
        self.c.ended.add(pod_name)

    def finish(self, name: str, code: int) -> None:
        """The job ends as its launcher did: exit `code` 0 succeeds, any other fails."""
        self.end(name, code)
        done = self.kind.succeeded if code == 0 else self.kind.failed(code)
        self.conditions(name, *self.kind.running, done)

    def write_outputs(self, name: str, world_size: int | None = None) -> TrainConfig:
        """A placeholder of rank 0's outputs (no training outcome), where job `name`'s trainer
        command says."""
        from components.train.config import from_argv

        _, args, _ = local_equivalent(self.kind.launcher(self.job(name))[0])
        train = from_argv(args)
        write_rank0_outputs(train, world_size)
        return train

    def collect(self, name: str) -> None:
        """The garbage collector's part: once job `name` is gone, delete its pods."""
        wait_until(lambda: self.c.job(name, self.kind.crd) is None, f"deletion of {name}")
        self._delete_pods(name)

    def _delete_pods(self, name: str) -> None:
        for pod_name in self.c.pod_names():
            if pod_name.startswith(f"{name}-"):
                self.c.core.delete_namespaced_pod(pod_name, NS)
                self.c.ended.add(pod_name)  # its containers are gone

    def play(self, script: Callable[[Operator], None]) -> None:
        """Run `script` in a thread; `join` waits for it and raises what it raised."""
        self._script = Background(lambda: script(self), f"the {self.kind.crd.kind} operator")

    def join(self, ceiling_s: float = HANG_S) -> None:
        """Wait for the script to end (AssertionError if it still runs after `ceiling_s`: a
        hang); raise what it raised."""
        assert self._script is not None
        self._script.join(ceiling_s)


class TrainerOperator(Operator):
    """Plays the controller, the kubelet and the garbage collector for one job of `kind` at a
    time, with the real trainer: the launcher is the command line the stored job holds, run by
    horovodrun on this machine (`launch.local_command`, the same ranks and arguments, the
    ``-x`` environment and the launcher's own, plus `env`), its output the launcher pod's log.
    When the job is deleted while it runs, the ranks are killed and the pods deleted, as
    Kubernetes would.
    """

    def __init__(self, cluster: Cluster, env: dict[str, str], kind: Kind = MPIJOB_KIND) -> None:
        super().__init__(cluster, kind)
        self.env = env
        self.starts = 0  # trainer launches, over every job served
        self.collected: list[int] = []  # pids of the ranks killed when a job was deleted
        self.lines: list[tuple[float, str]] = []  # every launcher line, with when it came
        self.killed_at: float | None = None  # when the ranks of a deleted job were killed

    def serve(self, name: str, poll_s: float = 0.1) -> int | None:
        """Run job `name` to its end: the trainer's exit code, or None if it was deleted."""
        from components.train.launcher.launch import job_environment, local_command

        command, launcher_env = self.kind.launcher(self.job(name))
        workers, args, exported = local_equivalent(command)
        pod_name = self.start(name)
        proc = subprocess.Popen(
            local_command(workers, args), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True, env=job_environment({**self.env, **launcher_env, **exported}),
            start_new_session=True,
        )  # fmt: skip
        self.starts += 1
        reader = threading.Thread(target=self._pump, args=(proc, pod_name), daemon=True)
        reader.start()
        while proc.poll() is None:
            if self.c.job(name, self.kind.crd) is None:
                self._collect(name, proc)
                return None
            time.sleep(poll_s)
        reader.join()
        self.finish(name, proc.returncode)
        return proc.returncode

    def _pump(self, proc: subprocess.Popen[str], pod_name: str) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            self.lines.append((time.monotonic(), line.rstrip("\n")))
            self.say(pod_name, line.rstrip("\n"))

    def _collect(self, name: str, proc: subprocess.Popen[str]) -> None:
        """The garbage collector's part: the job's containers are killed, its pods deleted."""
        from components.train.launcher.mpiwatch import kill_job

        ranks = list(rank_processes(proc.pid).values())
        self.killed_at = time.monotonic()
        kill_job(proc.pid)
        psutil.wait_procs(ranks, timeout=HANG_S)  # gone at once; what is not, the bench counts
        proc.wait()
        self.collected += [r.pid for r in ranks]
        self._delete_pods(name)
