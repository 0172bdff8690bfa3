"""The launcher pod's log, copied into the run's log as it is written, each line once. Runs in
the train step's pod, in a thread beside the job's run.
"""

from __future__ import annotations

import collections
import contextlib
import threading
from collections.abc import Callable
from typing import Any, Protocol

from components.train.launcher.log_dedup import RankLines

LOG_TAIL_LINES = 50
DRAIN_S = 30.0  # how long a finished job's launcher log may take to end before it is cut
TERMINAL_PHASES = ("Succeeded", "Failed")
Key = tuple[str, int]  # a launcher container: its pod's name and its restart count


class Run(Protocol):
    """What the log needs of a run (`cluster.run._Run`)."""

    @property
    def core(self) -> Any: ...  # a CoreV1Api

    @property
    def namespace(self) -> str: ...

    @property
    def log(self) -> Callable[[str], None]: ...

    @property
    def container(self) -> str: ...

    def pods(self, launcher: bool = False) -> list[Any]: ...


def _restarts(pod: Any, container: str) -> int:
    statuses = (pod.status.container_statuses if pod.status else None) or []
    return next((s.restart_count or 0 for s in statuses if s.name == container), 0)


# A thread follows the newest launcher pod's log with ``read_namespaced_pod_log(follow=True)``,
# which the kubelet streams until the container ends. A stream that breaks off while the container
# still runs is opened again, and the lines already copied are skipped; a new launcher pod, or a
# restarted container, is followed from its start. The last lines are kept for the failure message.
class LauncherLog:
    """Within ``with``, copies the launcher's log into `run`'s log (through `RankLines`: a line
    every rank prints alike, once) and keeps its last `LOG_TAIL_LINES` lines in `tail`."""

    def __init__(self, run: Run, poll_interval_s: float) -> None:
        self.run, self.log, self.poll_interval_s = run, RankLines(run.log), poll_interval_s
        self.container = run.container
        self.tail: collections.deque[str] = collections.deque(maxlen=LOG_TAIL_LINES)
        self.error: BaseException | None = None
        self.copied: dict[Key, int] = {}  # lines copied of each container's log
        self._closing, self._cut = threading.Event(), threading.Event()
        self._response: Any = None
        self._thread = threading.Thread(target=self._follow_all, name="launcher-log", daemon=True)

    def __enter__(self) -> LauncherLog:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close(drain_s=0.0)  # a cancelled or failed run's: cut at once

    def check(self) -> None:
        """Raise what stopped the copying (an API error other than a container not there)."""
        if self.error is not None:
            raise self.error

    def close(self, drain_s: float = DRAIN_S) -> None:
        """Stop following once the log has ended (the launcher's container ended), waiting
        `drain_s` at most; then cut the open stream."""
        self._closing.set()
        self._thread.join(drain_s)
        self._cut.set()
        response = self._response
        if self._thread.is_alive() and response is not None:
            with contextlib.suppress(Exception):
                response.shutdown()
        self._thread.join(DRAIN_S)

    def newest(self) -> Any:
        """The newest launcher pod, or None."""
        pods = self.run.pods(launcher=True)
        key = lambda p: (str(p.metadata.creation_timestamp or ""), p.metadata.name)  # noqa: E731
        return max(pods, key=key) if pods else None

    def pod_reason(self) -> str:
        """The newest launcher pod's status reason (``Evicted``), if any."""
        pod = self.newest()
        return str((pod.status.reason if pod is not None and pod.status else None) or "")

    def _follow_all(self) -> None:
        done: set[Key] = set()
        current: Key | None = None
        try:
            while True:
                closing = self._closing.is_set()  # one more pass once it is
                pod = self.newest()
                key = None if pod is None else (pod.metadata.name, _restarts(pod, self.container))
                if key is not None and key not in done:
                    if current is not None and key[0] != current[0]:
                        self.log(f"--- new launcher pod {key[0]} ---")
                    elif current is not None and key != current:
                        self.log("--- launcher container restarted ---")
                    current = key
                    if self._stream(key) and self._ended(key):
                        done.add(key)
                if closing or self._cut.is_set():
                    return
                self._closing.wait(self.poll_interval_s)
        except BaseException as exc:  # raised in the run's thread by check()
            self.error = exc

    def _ended(self, key: Key) -> bool:
        """Whether container `key` has ended: its pod is gone or done, or it was restarted."""
        from kubernetes.client.exceptions import ApiException

        try:
            pod = self.run.core.read_namespaced_pod(key[0], self.run.namespace)
        except ApiException as exc:
            if exc.status == 404:
                return True
            raise
        if (pod.status.phase if pod.status else None) in TERMINAL_PHASES:
            return True
        statuses = (pod.status.container_statuses if pod.status else None) or []
        mine = [s for s in statuses if s.name == self.container]
        return any(
            (s.restart_count or 0) != key[1] or bool(s.state and s.state.terminated) for s in mine
        )

    def _stream(self, key: Key) -> bool:
        """Copy container `key`'s lines past those copied already; True if its stream ended,
        False if it could not be opened (not started, or gone) or broke off."""
        import urllib3
        from kubernetes.client.exceptions import ApiException

        try:
            response = self.run.core.read_namespaced_pod_log(
                key[0],
                self.run.namespace,
                container=self.container,
                follow=True,
                _preload_content=False,
            )
        except ApiException as exc:
            if exc.status in (400, 404):  # the container has not started, or the pod is gone
                return False
            raise
        self._response, seen = response, 0
        try:
            for raw in response:  # each line as it arrives
                seen += 1
                if seen > self.copied.get(key, 0):
                    line = raw.decode("utf-8", errors="replace").rstrip("\r\n")
                    self.log(line)
                    self.tail.append(line)
                    self.copied[key] = seen
        except (urllib3.exceptions.HTTPError, OSError):  # it broke off, or close() cut it
            return False
        finally:
            self._response = None
            response.release_conn()
        return True
