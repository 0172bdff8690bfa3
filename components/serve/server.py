"""``make serve``, on the user's machine: the registry's production model over HTTP, on KServe's
own model server (components/serve/README.md), at ``POST
http://<host>:<port>/v1/models/<model>:predict`` on `host` only.
"""

from __future__ import annotations

import socket
import sys
import warnings
from pathlib import Path

import click

from components.common import storage_access
from components.common.declare import run_command
from components.common.defaults import MODEL_NAME, PRODUCTION_ALIAS, SERVE_MAX_BATCH
from components.common.failure import InputError, Stopped, one_line_failures, stops_on_signals
from components.common.model_files import BYTES_SIGNATURE
from components.register.registry import ModelStore
from components.register.serving import ServingFolder

MAX_PORT = 65535


def check_port(port: int) -> None:
    """InputError unless `port` is a TCP port one can listen on (checked first, in one line)."""
    if not 1 <= port <= MAX_PORT:
        raise InputError(f"--port must be 1..{MAX_PORT}, got {port}")


def listening_socket(host: str, port: int) -> socket.socket:
    """A socket bound to `host`:`port`, before the model loads (seconds): InputError, one line,
    when it cannot be (the port is taken, the host is not this machine's)."""
    check_port(port)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise InputError(f"cannot listen on {host}:{port}: {exc}") from None
    return sock


def serve(name: str, model_dir: str, sock: socket.socket, banner: str) -> None:
    """Serve the SavedModel at `model_dir` as `name` on the bound `sock` until stopped: SIGINT
    (Ctrl-C) or SIGTERM shuts the server down (uvicorn's graceful shutdown), then one
    ``STOPPED:`` line, and the program ends with 0, as a server stopped on purpose does."""
    from kserve import ModelServer
    from kserve.model_server import FASTAPI_APP_IMPORT_STRING

    from components.serve.predictor import ImagePredictor, RESTServer

    # KServe 0.21's V1 endpoints answer with FastAPI's ORJSONResponse, which FastAPI flags as
    # deprecated on every request; the warning is KServe's to act on, not a user's.
    warnings.filterwarnings("ignore", message="ORJSONResponse is deprecated")
    port = sock.getsockname()[1]
    predictor = ImagePredictor(name, model_dir)
    predictor.load()
    server = ModelServer(http_port=port, enable_grpc=False, workers=1)
    server.register_model(predictor)
    rest = RESTServer(
        FASTAPI_APP_IMPORT_STRING, server.dataplane, server.model_repository_extension, port
    )
    print(banner, flush=True)
    # uvicorn takes SIGINT and SIGTERM while it runs, shuts down, then raises the signal again
    # for the handlers it found: `stops_on_signals`', which turn it into one line here.
    try:
        with stops_on_signals():
            rest.run(sockets=[sock])  # KServe's server listens on every interface: not here
    except Stopped as stop:
        stop.ended.append(f"the server shut down; {name} is no longer served")
        print(stop.line(), flush=True)


# The alias's serving folder is synced first, then the version in it served. The port is checked,
# and bound, before the model loads; Ctrl-C (or SIGTERM) shuts the server down in one line, exit 0.
def serve_alias(registry_root: str, model_name: str, alias: str, host: str, port: int) -> None:
    """Sync `alias`'s serving folder, then serve the version in it; InputError when the registry
    cannot be read and written (`storage_access`), has no such version, or when `host`:`port`
    cannot be listened on."""
    storage_access.check([storage_access.Location("--registry-root", registry_root, True)])
    folder = ServingFolder(ModelStore(registry_root, model_name), alias)
    version = folder.sync()
    if version is None:
        raise InputError(
            f"no {alias} version of {model_name} in {registry_root}: train and register one "
            "with `make run` first"
        )
    model_dir = folder.version_uri(version)
    url = f"http://{host}:{port}/v1/models/{model_name}:predict"
    banner = f"serving {model_name} version {version} ({alias}) from {model_dir} at {url}"
    serve(model_name, model_dir, listening_socket(host, port), banner)


def example(count: int) -> str:
    """A request of the bundled dataset's first `count` test digits; their labels to stderr."""
    import json

    from components.data_prep.sources import bundled_digits

    images, labels = bundled_digits()["test"]
    print(f"labels: {' '.join(str(label) for label in labels[:count])}", file=sys.stderr)
    return json.dumps({"instances": images[:count].tolist()})


def image_request(paths: list[str]) -> str:
    """A request of image files, in TF Serving's binary form, for ``serving_bytes``."""
    import base64
    import json

    instances = []
    for path in paths:
        try:
            data = Path(path).read_bytes()
        except OSError as exc:
            raise InputError(f"--image {path}: cannot be read ({exc.strerror})") from exc
        instances.append({"b64": base64.b64encode(data).decode("ascii")})
    return json.dumps({"signature_name": BYTES_SIGNATURE, "instances": instances})


@click.command(help="Serve a registry's alias over TF Serving's REST API.")
@click.option("--registry-root", default="runs/registry", show_default=True, help="local or gs://")
@click.option("--model-name", default=MODEL_NAME, show_default=True)
@click.option("--alias", default=PRODUCTION_ALIAS, show_default=True)
@click.option("--host", default="127.0.0.1", show_default=True, help="the address to listen on")
@click.option("--port", type=int, default=8080, show_default=True)
@click.option(
    "--example",
    "example_count",
    type=int,
    metavar="N",
    help="print a request of N held-out digits (for curl -d @-) and exit",
)
@click.option(
    "--image",
    "images",
    multiple=True,
    metavar="FILE",
    help="print a request of this image file (JPEG, PNG, BMP, GIF; repeat for more; for curl "
    "-d @-) and exit",
)
def command(
    registry_root: str,
    model_name: str,
    alias: str,
    host: str,
    port: int,
    example_count: int | None,
    images: tuple[str, ...],
) -> int:
    """An expected failure (a bad registry, nothing to serve, a port it cannot listen on) ends
    in one ``FAILED:`` line and its exit code; Ctrl-C or SIGTERM in one ``STOPPED:`` line, exit 0
    (a server's way to end: `make serve` adds no error of its own)."""
    if images:
        with one_line_failures():
            print(image_request(list(images)))
        return 0
    if example_count is not None:
        if not 1 <= example_count <= SERVE_MAX_BATCH:
            raise click.UsageError(f"--example must be 1..{SERVE_MAX_BATCH}, got {example_count}")
        print(example(example_count))
        return 0
    with one_line_failures():
        check_port(port)  # before the registry is read and the model loaded
        serve_alias(registry_root, model_name, alias, host, port)
    return 0


def main(argv: list[str] | None = None) -> int:
    """The command line; returns the exit code."""
    return int(run_command(command, argv, "python -m components.serve"))
