"""A stand-in for the KFP v2beta1 REST API (a real one needs a cluster), for tests/test_ops.py:
in memory over real HTTP on 127.0.0.1, only the calls ``pipeline.ops`` makes through the real
``kfp.Client``, with only the fields the client reads. It records every request, answers chosen
ones with an error status (a JSON body like KFP's), and plays scripted states to each run.
"""

from __future__ import annotations

import itertools
import json
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qsl, urlsplit

API = "/apis/v2beta1"


@dataclass
class Request:
    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]  # names lower-cased
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


class KfpStandin:
    def __init__(self) -> None:
        self.pipelines: list[dict[str, Any]] = []
        self.versions: list[dict[str, Any]] = []
        self.experiments: list[dict[str, Any]] = []
        self.runs: list[dict[str, Any]] = []
        self.recurring_runs: list[dict[str, Any]] = []
        self.requests: list[Request] = []
        self.faults: list[list[Any]] = []  # [method, path pattern, status, message, times left]
        self.run_states: list[str] = ["SUCCEEDED"]
        self.task_details: list[dict[str, Any]] = []
        self._scripts: dict[str, list[str]] = {}  # run id -> the states it has still to report
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._routes: list[tuple[str, str, Callable[..., Any]]] = [
            ("GET", "/healthz", lambda r: {"multi_user": False}),
            ("GET", "/pipelines", lambda r: self._list(self.pipelines, r, "pipelines")),
            ("POST", "/pipelines", lambda r: self._add(self.pipelines, "pipeline", r.json())),
            ("POST", "/pipelines/upload_version", lambda r: self._add(self.versions,
             "pipeline_version", {"display_name": r.query["name"],
                                  "pipeline_id": r.query["pipelineid"]})),
            ("GET", "/pipelines/([^/]+)/versions", lambda r, pid: self._list(
             [v for v in self.versions if v["pipeline_id"] == pid], r, "pipeline_versions")),
            ("GET", "/experiments", lambda r: self._list(self.experiments, r, "experiments")),
            ("POST", "/experiments", lambda r: self._add(self.experiments, "experiment", r.json())),
            ("POST", "/runs", lambda r: self._add(self.runs, "run", r.json(), state="PENDING")),
            ("GET", "/runs/([^/]+)", self._get_run),
            ("POST", "/recurringruns",
             lambda r: self._add(self.recurring_runs, "recurring_run", r.json())),
        ]  # fmt: skip

    def __enter__(self) -> KfpStandin:
        standin = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                return

            def do_GET(self) -> None:
                standin._handle(self)

            do_POST = do_GET

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def fail(self, method: str, path: str, status: int, message: str, times: int = 1) -> None:
        """Answer the next `times` `method` requests whose path matches `path` with `status`."""
        self.faults.append([method, path, status, message, times])

    def script_runs(
        self, states: list[str], task_details: list[dict[str, Any]] | None = None
    ) -> None:
        """A run reports `states` on successive GETs (the last one sticks), with
        `task_details` (KFP's ``run_details.task_details``) in its last state."""
        self.run_states, self.task_details = states, task_details or []

    def calls(self, method: str, path: str) -> list[Request]:
        return [r for r in self.requests if r.method == method and re.fullmatch(path, r.path)]

    def seed(self, pipeline: str, *versions: str) -> str:
        """Add `pipeline` with `versions` (their names); return its id."""
        pid = self._add(self.pipelines, "pipeline", {"display_name": pipeline})["pipeline_id"]
        for name in versions:
            self._add(self.versions, "pipeline_version", {"display_name": name, "pipeline_id": pid})
        return str(pid)

    def _handle(self, handler: BaseHTTPRequestHandler) -> None:
        url = urlsplit(handler.path)
        body = handler.rfile.read(int(handler.headers.get("Content-Length") or 0))
        headers = {k.lower(): v for k, v in handler.headers.items()}
        request = Request(handler.command, url.path.removeprefix(API), dict(parse_qsl(url.query)),
                          headers, body)  # fmt: skip
        with self._lock:
            self.requests.append(request)
            status, payload = self._answer(request)
        data = json.dumps(payload).encode()
        handler.send_response(status)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(data)))
        handler.end_headers()
        handler.wfile.write(data)

    def _answer(self, request: Request) -> tuple[int, Any]:
        for fault in self.faults:
            method, path, status, message, times = fault
            if times and method == request.method and re.fullmatch(path, request.path):
                fault[4] -= 1
                return status, {"code": 13, "message": message, "details": []}
        for method, path, route in self._routes:
            if method == request.method and (match := re.fullmatch(path, request.path)):
                found = route(request, *match.groups())
                return (200, found) if found is not None else (404, {"message": "not found"})
        return 404, {"message": f"the stand-in has no route {request.method} {request.path}"}

    def _add(self, table: list[dict[str, Any]], kind: str, body: dict[str, Any],
             **fields: Any) -> dict[str, Any]:  # fmt: skip
        item = {**body, f"{kind}_id": f"{kind}-{next(self._ids)}", **fields}
        table.append(item)
        return item

    @staticmethod
    def _list(items: list[dict[str, Any]], request: Request, key: str) -> dict[str, Any]:
        """`items` filtered by the request's EQUALS predicates."""
        predicates = json.loads(request.query.get("filter", "{}")).get("predicates", [])
        wanted = [(p["key"], p["stringValue"]) for p in predicates]
        return {key: [i for i in items if all(i.get(k) == v for k, v in wanted)]}

    def _get_run(self, request: Request, run_id: str) -> dict[str, Any] | None:
        run = next((r for r in self.runs if r["run_id"] == run_id), None)
        if run is not None:
            states = self._scripts.setdefault(run_id, list(self.run_states))
            run["state"] = states.pop(0) if len(states) > 1 else states[0]
            if len(states) == 1 and self.task_details:
                run["run_details"] = {"task_details": self.task_details}
        return run
