"""A cluster job's pods on the API: which pods are the job's, which one is its launcher, and
the launcher's log copied into the train step's log as it grows (`LauncherLog`)."""

from __future__ import annotations

import collections
from collections.abc import Callable, Mapping
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from components.train.cluster.job import Backend
from components.train.mpiwatch import RankLines

LOG_TAIL_LINES = 50


def _labelled(core: client.CoreV1Api, namespace: str, *choices: Mapping[str, str]) -> list[Any]:
    """The pods with one of `choices`' labels (listed by the first; also checked here, in case
    a server ignores the selector)."""
    selector = ",".join(f"{key}={value}" for key, value in choices[0].items())
    return [
        pod
        for pod in core.list_namespaced_pod(namespace, label_selector=selector).items
        if any(all((pod.metadata.labels or {}).get(k) == v for k, v in c.items()) for c in choices)
    ]


def pods_of(core: client.CoreV1Api, backend: Backend, namespace: str, name: str) -> list[Any]:
    """The job's pods."""
    return _labelled(core, namespace, backend.pod_labels(name))


class LauncherLog:
    """Copies new lines of the launcher pod's log into `log`, and keeps the last ones: each poll
    reads the whole log of the newest launcher pod and emits the lines past those already
    emitted; a new launcher pod (or a restarted container whose log is shorter) starts over."""

    def __init__(
        self,
        core: client.CoreV1Api,
        backend: Backend,
        namespace: str,
        name: str,
        log: Callable[[str], None],
    ) -> None:
        self.core, self.backend, self.namespace, self.name = core, backend, namespace, name
        self.log = RankLines(log)  # each line once: components.train.mpiwatch
        self.pod_name: str | None = None
        self.emitted = 0
        self.tail: collections.deque[str] = collections.deque(maxlen=LOG_TAIL_LINES)
        self.pod_reason = ""

    def poll(self) -> None:
        """Emit the launcher's new lines (no-op until its container has started)."""
        pods = _labelled(self.core, self.namespace, *self.backend.launcher_labels(self.name))
        if not pods:
            return
        pod = max(pods, key=lambda p: (str(p.metadata.creation_timestamp or ""), p.metadata.name))
        self.pod_reason = (pod.status.reason or "") if pod.status else ""
        if pod.metadata.name != self.pod_name:
            if self.pod_name is not None:
                self.log(f"--- new launcher pod {pod.metadata.name} ---")
            self.pod_name, self.emitted = pod.metadata.name, 0
        try:
            text = self.core.read_namespaced_pod_log(
                pod.metadata.name, self.namespace, container=self.backend.launcher_container
            )
        except ApiException as exc:
            if exc.status in (400, 404):  # container not started yet, or pod gone
                return
            raise
        lines = str(text or "").splitlines()
        if len(lines) < self.emitted:
            self.log("--- launcher container restarted ---")
            self.emitted = 0
        for line in lines[self.emitted :]:
            self.log(line)
            self.tail.append(line)
        self.emitted = len(lines)
