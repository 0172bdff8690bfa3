"""A local stand-in for the handful of KFP v2beta1 REST endpoints ``pipeline.ops`` uses.

A stdlib ``ThreadingHTTPServer`` on 127.0.0.1 that keeps pipelines, versions, experiments,
runs and recurring runs in memory, records every request it gets, and can be told to fail
(any status, JSON error body like KFP's grpc-gateway) or to hang, so the tests drive the real
``kfp.Client`` over real HTTP. It is a stand-in for a KFP API server (which needs a cluster),
not a re-implementation: only the fields the client reads are filled in.
"""

from __future__ import annotations

import email.parser
import email.policy
import itertools
import json
import re
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

import yaml

API = "/apis/v2beta1"
# grpc codes KFP puts in its error bodies
_GRPC_CODE = {400: 3, 401: 16, 403: 7, 404: 5, 409: 6, 500: 13, 503: 14}


@dataclass
class Recorded:
    """One request the stand-in received."""

    method: str
    path: str
    query: dict[str, list[str]]
    headers: dict[str, str]  # names lower-cased
    json: Any = None
    files: dict[str, bytes] = field(default_factory=dict)

    def q(self, name: str) -> str | None:
        """Return the single value of query parameter `name`, or None."""
        values = self.query.get(name)
        return values[0] if values else None


@dataclass
class Fault:
    """Answer matching requests with `status` (or hang `delay` seconds first), `times` times."""

    method: str
    path: re.Pattern[str]
    status: int | None
    message: str
    delay: float = 0.0
    times: int | None = 1


class ApiError(Exception):
    """Raised inside a route to answer with an error status."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _matches_filter(item: dict[str, Any], raw_filter: str | None) -> bool:
    """Apply a KFP filter (EQUALS predicates only) to `item`."""
    if not raw_filter:
        return True
    predicates = json.loads(raw_filter).get("predicates", [])
    for p in predicates:
        if p.get("operation") not in (1, "EQUALS"):
            raise ApiError(400, f"stand-in supports EQUALS filters only, got {p}")
        wanted = p.get("stringValue", p.get("string_value"))
        if item.get(p["key"]) != wanted:
            return False
    return True


class KfpStandin:
    """The in-memory KFP API; use as a context manager or call start()/stop()."""

    def __init__(self, *, multi_user: bool = False, max_page_size: int = 100) -> None:
        self.multi_user = multi_user
        self.max_page_size = max_page_size
        self.pipelines: dict[str, dict[str, Any]] = {}
        self.versions: dict[str, dict[str, Any]] = {}
        self.experiments: dict[str, dict[str, Any]] = {}
        self.runs: dict[str, dict[str, Any]] = {}
        self.recurring_runs: dict[str, dict[str, Any]] = {}
        self.requests: list[Recorded] = []
        self.faults: list[Fault] = []
        self.run_script: list[str] = ["SUCCEEDED"]
        self.run_task_details: list[dict[str, Any]] = []
        self._run_states: dict[str, list[str]] = {}
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # ---- lifecycle -------------------------------------------------------------------------

    def start(self) -> KfpStandin:
        """Listen on a free port of 127.0.0.1 in a daemon thread."""
        standin = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:  # quiet
                return

            def do_GET(self) -> None:
                standin._handle(self, "GET")

            def do_POST(self) -> None:
                standin._handle(self, "POST")

            def do_DELETE(self) -> None:
                standin._handle(self, "DELETE")

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop listening."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> KfpStandin:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def url(self) -> str:
        """``http://127.0.0.1:<port>``."""
        assert self._server is not None, "not started"
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    # ---- test controls ---------------------------------------------------------------------

    def fail(
        self, method: str, path: str, status: int, message: str = "injected", times: int | None = 1
    ) -> None:
        """Answer the next `times` (None: all) `method` requests whose path matches `path`
        (a regex, full match after ``/apis/v2beta1``) with `status`."""
        self.faults.append(Fault(method, re.compile(path), status, message, 0.0, times))

    def hang(self, method: str, path: str, seconds: float, times: int | None = None) -> None:
        """Make matching requests wait `seconds` before being answered normally."""
        self.faults.append(Fault(method, re.compile(path), None, "", seconds, times))

    def script_runs(
        self, states: list[str], task_details: list[dict[str, Any]] | None = None
    ) -> None:
        """Runs created from now on report `states` on successive GETs (the last one sticks),
        with `task_details` (KFP ``run_details.task_details``) once they are in the last state."""
        self.run_script = list(states)
        self.run_task_details = list(task_details or [])

    def calls(self, method: str, path: str) -> list[Recorded]:
        """The recorded `method` requests whose path (after /apis/v2beta1) fully matches `path`."""
        pattern = re.compile(path)
        return [
            r
            for r in self.requests
            if r.method == method and pattern.fullmatch(r.path.removeprefix(API))
        ]

    def seed_pipeline(
        self, name: str, versions: dict[str, dict[str, Any]] | None = None, namespace: str = ""
    ) -> str:
        """Create pipeline `name` with `versions` (version name -> pipeline spec); return its id."""
        pipeline = self._create_pipeline({"display_name": name, "namespace": namespace})
        for version_name, spec in (versions or {}).items():
            self._create_version(pipeline["pipeline_id"], version_name, spec)
        return str(pipeline["pipeline_id"])

    # ---- HTTP plumbing ---------------------------------------------------------------------

    def _handle(self, handler: BaseHTTPRequestHandler, method: str) -> None:
        split = urlsplit(handler.path)
        length = int(handler.headers.get("Content-Length") or 0)
        body = handler.rfile.read(length) if length else b""
        ctype = handler.headers.get("Content-Type", "")
        headers = {k.lower(): v for k, v in handler.headers.items()}
        recorded = Recorded(method, split.path, parse_qs(split.query), headers)
        if body and "json" in ctype:
            recorded.json = json.loads(body)
        elif body and ctype.startswith("multipart/form-data"):
            recorded.files = _parse_multipart(ctype, body)
        with self._lock:
            self.requests.append(recorded)
            fault = self._take_fault(method, split.path)
        if fault is not None and fault.delay:
            time.sleep(fault.delay)
        try:
            if fault is not None and fault.status is not None:
                raise ApiError(fault.status, fault.message)
            with self._lock:
                status, payload = self._route(recorded)
        except ApiError as exc:
            status = exc.status
            code = _GRPC_CODE.get(exc.status, 2)
            payload = {"error": exc.message, "code": code, "message": exc.message, "details": []}
        data = json.dumps(payload).encode()
        try:
            handler.send_response(status)
            handler.send_header("Content-Type", "application/json")
            handler.send_header("Content-Length", str(len(data)))
            handler.end_headers()
            handler.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):  # the client gave up (timeout tests)
            pass

    def _take_fault(self, method: str, path: str) -> Fault | None:
        for fault in self.faults:
            if fault.method == method and fault.path.fullmatch(path.removeprefix(API)):
                if fault.times is not None:
                    fault.times -= 1
                    if fault.times == 0:
                        self.faults.remove(fault)
                return fault
        return None

    def _new_id(self, kind: str) -> str:
        return f"{kind}-{next(self._ids)}"

    def _page(self, items: list[dict[str, Any]], rec: Recorded, key: str) -> dict[str, Any]:
        """Filter, then paginate `items` as KFP does (page_token is an offset here)."""
        items = [i for i in items if _matches_filter(i, rec.q("filter"))]
        namespace = rec.q("namespace")
        if namespace is not None:
            items = [i for i in items if i.get("namespace") in (namespace, None, "")]
        size = min(int(rec.q("page_size") or 20), self.max_page_size)
        start = int(rec.q("page_token") or 0)
        page = items[start : start + size]
        out: dict[str, Any] = {key: page, "total_size": len(items)}
        if start + size < len(items):
            out["next_page_token"] = str(start + size)
        return out

    # ---- the API ---------------------------------------------------------------------------

    def _route(self, rec: Recorded) -> tuple[int, Any]:
        path = rec.path.removeprefix(API)
        m = rec.method
        if m == "GET" and path == "/healthz":
            return 200, {"multi_user": self.multi_user}
        if m == "GET" and path == "/pipelines":
            return 200, self._page(list(self.pipelines.values()), rec, "pipelines")
        if m == "POST" and path == "/pipelines":
            return 200, self._create_pipeline(rec.json or {})
        if m == "POST" and path == "/pipelines/upload":
            return 200, self._upload_pipeline(rec)
        if m == "POST" and path == "/pipelines/upload_version":
            return 200, self._upload_version(rec)
        if match := re.fullmatch(r"/pipelines/([^/]+)", path):
            pipeline = self._get(self.pipelines, match[1], "pipeline")
            if m == "GET":
                return 200, pipeline
        if match := re.fullmatch(r"/pipelines/([^/]+)/versions", path):
            self._get(self.pipelines, match[1], "pipeline")
            mine = [v for v in self.versions.values() if v["pipeline_id"] == match[1]]
            if m == "GET":
                return 200, self._page(mine, rec, "pipeline_versions")
        if match := re.fullmatch(r"/pipelines/([^/]+)/versions/([^/]+)", path):
            version = self._get(self.versions, match[2], "pipeline version")
            if m == "GET" and version["pipeline_id"] == match[1]:
                return 200, version
        if m == "GET" and path == "/experiments":
            return 200, self._page(list(self.experiments.values()), rec, "experiments")
        if m == "POST" and path == "/experiments":
            return 200, self._create_experiment(rec.json or {})
        if m == "POST" and path == "/runs":
            return 200, self._create_run(rec.json or {})
        if match := re.fullmatch(r"/runs/([^/:]+)", path):
            run = self._get(self.runs, match[1], "run")
            if m == "GET":
                return 200, self._advance(run)
        if m == "POST" and path == "/recurringruns":
            return 200, self._create_recurring_run(rec.json or {})
        if m == "GET" and path == "/recurringruns":
            return 200, self._page(list(self.recurring_runs.values()), rec, "recurringRuns")
        if match := re.fullmatch(r"/recurringruns/([^/:]+)(:enable|:disable)?", path):
            job = self._get(self.recurring_runs, match[1], "recurring run")
            if m == "GET" and not match[2]:
                return 200, job
            if m == "DELETE" and not match[2]:
                del self.recurring_runs[match[1]]
                return 200, {}
            if m == "POST" and match[2]:
                enable = match[2] == ":enable"
                job["mode"] = "ENABLE" if enable else "DISABLE"
                job["status"] = "ENABLED" if enable else "DISABLED"
                return 200, {}
        raise ApiError(404, f"stand-in has no route {m} {rec.path}")

    @staticmethod
    def _get(table: dict[str, dict[str, Any]], key: str, kind: str) -> dict[str, Any]:
        if key not in table:
            raise ApiError(404, f"{kind} {key} not found")
        return table[key]

    def _create_pipeline(self, body: dict[str, Any]) -> dict[str, Any]:
        name = body.get("display_name")
        if not name:
            raise ApiError(400, "pipeline display_name is required")
        namespace = body.get("namespace") or ""
        for p in self.pipelines.values():
            if p["display_name"] == name and p["namespace"] == namespace:
                raise ApiError(409, f"pipeline {name} already exists")
        pipeline: dict[str, Any] = {
            "pipeline_id": self._new_id("pipeline"),
            "display_name": name,
            "description": body.get("description") or "",
            "namespace": namespace,
            "created_at": _now(),
        }
        self.pipelines[pipeline["pipeline_id"]] = pipeline
        return pipeline

    def _create_version(self, pipeline_id: str, name: str, spec: dict[str, Any]) -> dict[str, Any]:
        self._get(self.pipelines, pipeline_id, "pipeline")
        for v in self.versions.values():
            if v["pipeline_id"] == pipeline_id and v["display_name"] == name:
                raise ApiError(409, f"pipeline version {name} already exists")
        version: dict[str, Any] = {
            "pipeline_id": pipeline_id,
            "pipeline_version_id": self._new_id("version"),
            "display_name": name,
            "created_at": _now(),
            "pipeline_spec": spec,
        }
        self.versions[version["pipeline_version_id"]] = version
        return version

    @staticmethod
    def _package(rec: Recorded) -> dict[str, Any]:
        if "uploadfile" not in rec.files:
            raise ApiError(400, "missing uploadfile")
        try:
            spec = next(yaml.safe_load_all(rec.files["uploadfile"]))
        except (yaml.YAMLError, StopIteration) as exc:
            raise ApiError(400, f"invalid pipeline spec: {exc}") from exc
        if not isinstance(spec, dict) or "root" not in spec:
            raise ApiError(400, "invalid pipeline spec: no root")
        return spec

    def _upload_pipeline(self, rec: Recorded) -> dict[str, Any]:
        spec = self._package(rec)
        name = rec.q("name") or spec["pipelineInfo"]["name"]
        pipeline = self._create_pipeline({"display_name": name, "namespace": rec.q("namespace")})
        self._create_version(pipeline["pipeline_id"], name, spec)
        return pipeline

    def _upload_version(self, rec: Recorded) -> dict[str, Any]:
        spec = self._package(rec)
        pipeline_id, name = rec.q("pipelineid"), rec.q("name")
        if not pipeline_id or not name:
            raise ApiError(400, "pipelineid and name are required")
        return self._create_version(pipeline_id, name, spec)

    def _create_experiment(self, body: dict[str, Any]) -> dict[str, Any]:
        name = body.get("display_name")
        for e in self.experiments.values():
            if e["display_name"] == name:
                raise ApiError(409, f"experiment {name} already exists")
        experiment: dict[str, Any] = {
            "experiment_id": self._new_id("experiment"),
            "display_name": name,
            "namespace": body.get("namespace") or "",
            "storage_state": "AVAILABLE",
        }
        self.experiments[experiment["experiment_id"]] = experiment
        return experiment

    def _check_source(self, body: dict[str, Any]) -> None:
        ref = body.get("pipeline_version_reference")
        if ref:
            version = self._get(self.versions, ref.get("pipeline_version_id", ""), "version")
            if version["pipeline_id"] != ref.get("pipeline_id"):
                raise ApiError(400, "version does not belong to pipeline")
        elif not body.get("pipeline_spec"):
            raise ApiError(400, "a run needs a pipeline_spec or a pipeline_version_reference")
        self._get(self.experiments, body.get("experiment_id", ""), "experiment")

    def _create_run(self, body: dict[str, Any]) -> dict[str, Any]:
        self._check_source(body)
        run = dict(body)
        run.update(run_id=self._new_id("run"), state="PENDING", created_at=_now())
        self.runs[run["run_id"]] = run
        self._run_states[run["run_id"]] = list(self.run_script)
        return run

    def _advance(self, run: dict[str, Any]) -> dict[str, Any]:
        states = self._run_states[run["run_id"]]
        run["state"] = states.pop(0) if len(states) > 1 else states[0]
        if len(states) == 1 and run["state"] == states[0] and self.run_task_details:
            run["run_details"] = {"task_details": self.run_task_details}
        return run

    def _create_recurring_run(self, body: dict[str, Any]) -> dict[str, Any]:
        self._check_source(body)
        job = dict(body)
        job.update(
            recurring_run_id=self._new_id("recurring"),
            status="ENABLED" if body.get("mode") == "ENABLE" else "DISABLED",
            created_at=_now(),
        )
        self.recurring_runs[job["recurring_run_id"]] = job
        return job


_CRON_BOUNDS: tuple[tuple[int, int, tuple[str, ...]], ...] = (
    (0, 59, ()),  # second
    (0, 59, ()),  # minute
    (0, 23, ()),  # hour
    (1, 31, ()),  # day of month
    (
        1,
        12,
        ("", "jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"),
    ),
    (0, 6, ("sun", "mon", "tue", "wed", "thu", "fri", "sat")),  # day of week
)
_DESCRIPTORS = {"@yearly", "@annually", "@monthly", "@weekly", "@daily", "@midnight", "@hourly"}
_GO_DURATION = re.compile(r"(\d+(\.\d*)?(ns|us|µs|ms|s|m|h))+")


def _parse_multipart(ctype: str, body: bytes) -> dict[str, bytes]:
    """Return ``{field name: content}`` of a multipart/form-data body."""
    message = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(
        b"Content-Type: " + ctype.encode() + b"\r\n\r\n" + body
    )
    fields: dict[str, bytes] = {}
    for part in message.iter_parts():  # type: ignore[attr-defined]
        name = part.get_param("name", header="content-disposition")
        payload = part.get_payload(decode=True)
        fields[str(name)] = payload if isinstance(payload, bytes) else b""
    return fields
