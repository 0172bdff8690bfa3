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


class TrainedModel:
    """A real exported model for tests: `path` (SavedModel dir), `dataset` (dataset dir) and the
    `accuracy`/`loss` Keras itself reports for the in-memory model on the test split."""

    def __init__(self, path: str, dataset: str, accuracy: float, loss: float) -> None:
        self.path = path
        self.dataset = dataset
        self.accuracy = accuracy
        self.loss = loss


@pytest.fixture(scope="session")
def tiny_dataset(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The bundled digits, 400 train / 400 test samples, in the dataset format (session-wide)."""
    from components.data_prep.prep import prepare

    out = tmp_path_factory.mktemp("tiny-dataset") / "ds"
    prepare("bundled", str(out), shard_size=256, limit=400)
    return str(out)


@pytest.fixture(scope="session")
def trained_model(tiny_dataset: str, tmp_path_factory: pytest.TempPathFactory) -> TrainedModel:
    """`build_model` trained 3 quick epochs on `tiny_dataset` and exported as the trainer does
    (``model.save(dir, include_optimizer=False)``). Not Horovod: just a real SavedModel."""
    import tensorflow as tf

    from components.common.dataset import load_split
    from components.train.model import build_model

    x, y = load_split(tiny_dataset, "train")
    x_test, y_test = load_split(tiny_dataset, "test")
    model = build_model(seed=7)
    model.compile(
        optimizer=tf.keras.optimizers.Adam(0.003),
        loss="sparse_categorical_crossentropy",
        metrics=["accuracy"],
    )
    model.fit(x, y, epochs=3, batch_size=32, verbose=0)
    loss, accuracy = model.evaluate(x_test, y_test, batch_size=400, verbose=0)
    path = tmp_path_factory.mktemp("trained-model") / "model"
    model.save(str(path), include_optimizer=False)
    return TrainedModel(str(path), tiny_dataset, float(accuracy), float(loss))
