"""Shared pytest fixtures.

``gcs_bucket`` gives a test a fresh bucket in a real ``gcp-storage-emulator`` server, reached
through the real ``google-cloud-storage`` client (``STORAGE_EMULATOR_HOST`` is set for the test
and for any subprocess it starts). ``gcs_uri`` is the matching ``gs://<bucket>`` prefix.

What the emulator cannot show: it ignores ``ifGenerationMatch`` preconditions, so code that
relies on them (exclusive creates, compare-and-swap) runs but is not *raced* here; test
concurrency on local disk instead.
"""

from __future__ import annotations

import itertools
import logging
import socket
from collections.abc import Iterator
from typing import Any

import pytest

_bucket_ids = itertools.count()


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("localhost", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="session")
def gcs_emulator() -> Iterator[tuple[Any, str]]:
    """One in-memory gcp-storage-emulator for the session: yields ``(server, "localhost:PORT")``."""
    from gcp_storage_emulator.server import create_server

    logging.getLogger("gcp_storage_emulator").setLevel(logging.WARNING)
    port = _free_port()
    server = create_server("localhost", port, in_memory=True)
    server.start()
    try:
        yield server, f"localhost:{port}"
    finally:
        server.stop()


@pytest.fixture
def gcs_bucket(gcs_emulator: tuple[Any, str], monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A new, empty bucket in the emulator; yields its name (use ``f"gs://{gcs_bucket}/..."``)."""
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage as gcs

    from components.common import storage

    server, host = gcs_emulator
    server.wipe()
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", f"http://{host}")
    monkeypatch.setenv("GOOGLE_CLOUD_PROJECT", "emulator")
    storage._client.cache_clear()
    name = f"test-bucket-{next(_bucket_ids)}"
    gcs.Client(project="emulator", credentials=AnonymousCredentials()).create_bucket(name)
    try:
        yield name
    finally:
        storage._client.cache_clear()


@pytest.fixture
def gcs_uri(gcs_bucket: str) -> str:
    """``gs://<bucket>`` of the fresh `gcs_bucket` (no trailing slash)."""
    return f"gs://{gcs_bucket}"
