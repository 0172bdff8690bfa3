"""Transient GCS errors: 503 and 429 on a share of the requests, injected by
`standins.fake_gcs.FaultProxy` in front of the suite's fake-gcs-server (the real
google-cloud-storage client talks to the proxy). Data prep, the trainer's checkpoints,
evaluation and registration all retry and succeed, and each retry is logged once: the
storage layer's retry warnings equal, in number and status, the faults the proxy injected.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest

from components.common import dataset, storage
from standins.fake_gcs import FaultProxy, create_bucket
from tests.conftest import storage_emulator, summary_json

SHARE = 0.2  # of the requests answered with a fault
STORAGE_LOGGER = "components.common.storage"
_ids = itertools.count()


@dataclass
class Faulty:
    """A bucket reached through the fault proxy; faults only inside `faults`."""

    proxy: FaultProxy
    root: str
    caplog: pytest.LogCaptureFixture

    @contextlib.contextmanager
    def faults(self) -> Iterator[None]:
        """`SHARE` of the requests in the block fail; after it, each fault must have been
        retried, and logged, once."""
        self.caplog.set_level(logging.WARNING, logger=STORAGE_LOGGER)
        self.proxy.share = SHARE
        try:
            yield
        finally:
            self.proxy.share = 0.0
        faults = self.proxy.injected
        assert faults, "the proxy injected no fault: this run proves nothing"
        logged = logged_retries(self.caplog)
        statuses = [int(m[1]) for m in (re.search(r"HTTP (\d+)", line) for line in logged) if m]
        assert len(logged) == len(faults), "\n".join(logged)
        assert sorted(statuses) == sorted(f.status for f in faults)


@pytest.fixture
def faulty(gcs_emulator: str, caplog: pytest.LogCaptureFixture) -> Iterator[Faulty]:
    name = f"faults-{next(_ids)}"
    create_bucket(gcs_emulator, name)
    with FaultProxy(gcs_emulator, share=0.0, seed=11) as proxy, storage_emulator(proxy.url):
        yield Faulty(proxy, f"gs://{name}", caplog)


def logged_retries(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == STORAGE_LOGGER]


def test_the_retry_policy_retries_429_and_503_and_logs_each_retry(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The policy as the storage client uses it (``retry(request)()``): a request failing with
    503, or 429, is tried again and succeeds, each retry logged once; 404 and 412 are not
    retried (a 412 is a conditional write's answer). GCS's back-off sleeps up to 1 s a retry."""
    from google.api_core import exceptions as gexc

    def request(*faults: Exception) -> Any:
        left, calls = list(faults), []

        def call() -> str:
            calls.append(1)
            if left:
                raise left.pop(0)
            return "answered"

        call.calls = calls  # type: ignore[attr-defined]
        return call

    caplog.set_level(logging.WARNING, logger=STORAGE_LOGGER)
    read = request(gexc.ServiceUnavailable("try again"))
    assert storage._retry("read", "gs://b/k")(read)() == "answered"
    check = request(gexc.TooManyRequests("slow down"))
    assert storage._retry("access check", "gs://b/data")(check)() == "answered"
    assert (len(read.calls), len(check.calls)) == (2, 2)
    for final in (gexc.NotFound("gone"), gexc.PreconditionFailed("stale")):
        refused = request(final)
        with pytest.raises(type(final)):
            storage._retry("read", "gs://b/k")(refused)()
        assert len(refused.calls) == 1
    assert logged_retries(caplog) == [
        "GCS read gs://b/k failed: HTTP 503 (ServiceUnavailable); retrying",
        "GCS access check gs://b/data failed: HTTP 429 (TooManyRequests); retrying",
    ]
    # bench.faults counts each of them in a job's log, behind the rank's tag.
    tagged = [f"[1,0]<stderr>:WARNING:{STORAGE_LOGGER}:{m}" for m in logged_retries(caplog)]
    assert all(storage.RETRY_LINE.search(line) for line in tagged)


def test_data_prep_retries_and_writes_the_whole_dataset(faulty: Faulty) -> None:
    from components.data_prep.prep import prepare

    data = f"{faulty.root}/data"
    with faulty.faults():
        prepare("bundled", data, shard_size=250, data_limit=600)
    manifest = dataset.read_manifest(data)
    assert (manifest.count("train"), manifest.count("test")) == (600, 600)


def test_checkpoints_save_and_restore_retry(faulty: Faulty, tmp_path: Any) -> None:
    from components.common import keras_env
    from components.train.rank import checkpoints
    from components.train.rank.adam import fused_adam
    from components.train.rank.model import build_model

    keras_env.keras()
    uri = f"{faulty.root}/run/checkpoints"
    saved, restored = build_model(3, "small"), build_model(4, "small")
    optimizers = [fused_adam(learning_rate=0.01) for _ in (saved, restored)]
    for model, optimizer in zip((saved, restored), optimizers, strict=True):
        optimizer.build(model.trainable_variables)
    with faulty.faults():
        ckpt = checkpoints.new_checkpoint(saved, optimizers[0])
        saver = checkpoints.Saver(ckpt, uri, tmp_path / "rank0")
        for epoch in (1, 2, 3):
            saver.save(epoch, {"loss": 1.0 / epoch}, "small")
        info = checkpoints.latest(uri, workdir=tmp_path / "rank0-resumed")
        assert info is not None and (info.epoch, info.metrics) == (3, {"loss": 1.0 / 3})
        into = checkpoints.new_checkpoint(restored, optimizers[1])
        checkpoints.restore(into, uri, info, tmp_path / "rank1")
    for a, b in zip(saved.get_weights(), restored.get_weights(), strict=True):
        np.testing.assert_array_equal(a, b)


def _upload_inputs(faulty: Faulty, trained_model: Any) -> tuple[str, str]:
    """The model and its dataset on the faulty bucket (uploaded before faults start)."""
    model_uri, data_uri = f"{faulty.root}/run/model", f"{faulty.root}/data"
    storage.upload_dir(trained_model.path, model_uri, last="saved_model.pb")
    storage.upload_dir(trained_model.dataset, data_uri, last=dataset.MANIFEST)
    return model_uri, data_uri


def test_evaluate_retries_and_scores_the_model(faulty: Faulty, trained_model: Any) -> None:
    from components.evaluate.evaluate import evaluate

    model_uri, data_uri = _upload_inputs(faulty, trained_model)
    with faulty.faults():
        digest = trained_model.saved_model_sha256
        result = evaluate(model_uri, data_uri, saved_model_sha256=digest)
    assert result.accuracy == pytest.approx(trained_model.accuracy, abs=1e-6)


def test_register_retries_and_publishes_one_version(faulty: Faulty, trained_model: Any) -> None:
    from components.register.register import register

    model_uri, data_uri = _upload_inputs(faulty, trained_model)
    summary_uri = f"{faulty.root}/run/run_summary.json"
    storage.write_text(summary_uri, summary_json(trained_model.saved_model_sha256, world_size=1))
    with faulty.faults():
        decision = register(
            model_uri, summary_uri, data_uri, trained_model.accuracy, trained_model.loss,
            registry_root=f"{faulty.root}/models", pipeline_run_id="run-faults", min_accuracy=0.0,
        )  # fmt: skip
    assert decision.registered and decision.version == 1 and decision.promoted
    registry = f"{faulty.root}/models/mnist-cnn"
    files = storage.list_files(registry)
    serving = f"{registry}/_serving/production/"
    versions = [f for f in files if not f.startswith(serving)]
    assert sum(f.endswith("saved_model.pb") for f in versions) == 1
    assert not [f for f in files if "/_staging/" in f]
    # The alias's serving folder holds that one version, whole, through the faults too.
    published = sorted(f.removeprefix(serving) for f in files if f.startswith(serving))
    assert published == sorted(f.removeprefix(f"{registry}/") for f in versions if "/1/" in f)
