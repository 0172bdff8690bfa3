"""Checkpoints: the marker names the model trained; a damaged latest checkpoint (or
``latest.json``) falls back to the one before, saying so once; all unusable stops the run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from components.common import storage
from components.train.rank import checkpoints

DATA = "ckpt.data-00000-of-00001"


class _FakeCheckpoint:
    """Stands in for ``tf.train.Checkpoint``: writes the two files the real one writes."""

    def __init__(self, payload: str = "weights") -> None:
        self.payload = payload

    def write(self, prefix: str) -> None:
        Path(prefix + ".index").write_text("index")
        Path(prefix + ".data-00000-of-00001").write_text(self.payload * 100)


def test_marker_records_the_model_and_refuses_another(tmp_path: Path) -> None:
    uri = str(tmp_path / "checkpoints")
    checkpoints.save(_FakeCheckpoint(), uri, 2, {"loss": 0.5}, "small")
    marker = json.loads((tmp_path / "checkpoints" / "latest.json").read_text())
    assert marker == {
        "epoch": 2,
        "prefix": "epoch-0002/ckpt",
        "metrics": {"loss": 0.5},
        "model": "small",
        "keras": 3,
    }
    info = checkpoints.latest(uri)
    assert info is not None and info.model == "small"
    assert info.resume_problem("small", uri) is None
    assert info.resume_problem("mnist_advanced", uri) == (
        f"the checkpoints at {uri} were written training model 'small', and this run trains "
        "'mnist_advanced': resume with model='small', or start the run in a fresh output (or "
        "checkpoint) directory"
    )


def test_a_checkpoint_of_the_tf_keras_trainer_is_refused_by_name(tmp_path: Path) -> None:
    """The tf-keras (Keras 2) trainer's markers have no "keras" field; Keras 3's object graph
    differs from theirs, so a resume is refused before anything is restored."""
    uri = str(tmp_path / "checkpoints")
    checkpoints.save(_FakeCheckpoint(), uri, 2, {"loss": 0.5}, "small")
    for marker in (tmp_path / "checkpoints").rglob("*.json"):  # as the tf-keras trainer wrote
        marker.write_text(
            json.dumps({k: v for k, v in json.loads(marker.read_text()).items() if k != "keras"})
        )
    info = checkpoints.latest(uri)
    assert info is not None and info.keras == 2
    assert info.resume_problem("small", uri) == (
        f"the checkpoints at {uri} were written by the tf-keras (Keras 2) trainer, whose "
        "checkpoints Keras 3 cannot restore: start the run in a fresh output (or checkpoint) "
        "directory"
    )


def test_a_tree_without_per_epoch_markers_is_refused_not_restarted(tmp_path: Path) -> None:
    (tmp_path / "latest.json").write_text(json.dumps({"epoch": 1, "prefix": "epoch-0001/ckpt"}))
    (tmp_path / "epoch-0001").mkdir()
    (tmp_path / "epoch-0001" / "ckpt.index").write_text("index")
    with pytest.raises(checkpoints.CheckpointError, match="none can be resumed from"):
        checkpoints.latest(str(tmp_path))


@pytest.fixture(params=["local", "gcs"])
def three_epochs(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "local":
        uri = str(tmp_path / "checkpoints")
    else:
        uri = f"gs://{request.getfixturevalue('gcs_bucket')}/run/checkpoints"
    for epoch in (1, 2, 3):
        checkpoints.save(_FakeCheckpoint(f"e{epoch}"), uri, epoch, {"loss": 1 / epoch}, "small")
    return uri


def _delete(uri: str) -> None:
    if storage.is_gcs(uri):
        storage._blob(uri).delete()
    else:
        Path(uri).unlink()


def _fallback_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "components.train.rank.checkpoints"]


def test_each_epoch_records_its_files_and_the_newest_is_chosen(
    three_epochs: str, caplog: pytest.LogCaptureFixture
) -> None:
    names = {
        f.rsplit("/", 2)[-2] + "/" + f.rsplit("/", 1)[-1] for f in storage.list_files(three_epochs)
    }
    assert names == {
        "epoch-0002/checkpoint.json",
        "epoch-0002/ckpt.index",
        f"epoch-0002/{DATA}",
        "epoch-0003/checkpoint.json",
        "epoch-0003/ckpt.index",
        f"epoch-0003/{DATA}",
        "checkpoints/latest.json",
    }
    marker = json.loads(storage.read_text(f"{three_epochs}/epoch-0003/checkpoint.json"))
    assert marker["files"][DATA]["bytes"] == 200 and len(marker["files"][DATA]["sha256"]) == 64
    info = checkpoints.latest(three_epochs)
    assert info == checkpoints.CheckpointInfo(3, "epoch-0003/ckpt", {"loss": 1 / 3}, "small")
    assert _fallback_lines(caplog) == []


EPOCH_3 = "checkpoint after epoch 3 is unreadable ("


@pytest.mark.parametrize(
    ("damage", "epoch", "said"),
    [
        (
            lambda u: storage.write_bytes(f"{u}/epoch-0003/{DATA}", b"e3" * 10),
            2,
            f"{EPOCH_3}{DATA} has 20 bytes, 200 were written); ",
        ),
        (
            lambda u: storage.write_bytes(f"{u}/epoch-0003/{DATA}", b"xx" * 100),
            2,
            f"{EPOCH_3}{DATA} does not match the sha256 recorded when it was written); ",
        ),
        (lambda u: _delete(f"{u}/epoch-0003/{DATA}"), 2, f"{EPOCH_3}{DATA} is missing); "),
        (lambda u: storage.remove_tree(f"{u}/epoch-0003"), 2, f"{EPOCH_3}its directory is missing"),
        (
            lambda u: storage.write_text(f"{u}/epoch-0003/checkpoint.json", "{"),
            2,
            f"{EPOCH_3}unreadable: Expecting property name",
        ),
        # latest.json unreadable: the newest complete epoch
        (
            lambda u: storage.write_text(f"{u}/latest.json", '{"epoch": 3, "pre'),
            3,
            "latest.json is unreadable: ",
        ),
    ],
    ids=["truncated", "corrupt", "data-deleted", "dir-deleted", "marker-corrupt", "latest-json"],
)
def test_a_damaged_checkpoint_is_passed_over_in_one_line(
    three_epochs: str, caplog: pytest.LogCaptureFixture, damage, epoch: int, said: str
) -> None:
    damage(three_epochs)
    info = checkpoints.latest(three_epochs)
    assert info is not None and (info.epoch, info.metrics) == (epoch, {"loss": 1 / epoch})
    (line,) = _fallback_lines(caplog)
    assert line.startswith(said) and line.endswith(f"; resuming from epoch {epoch}")


def test_an_epoch_written_after_latest_json_is_not_committed(tmp_path: Path) -> None:
    uri = str(tmp_path)
    checkpoints.save(_FakeCheckpoint(), uri, 1, {}, "small")
    latest_json = (tmp_path / "latest.json").read_text()
    checkpoints.save(_FakeCheckpoint(), uri, 2, {}, "small")  # killed before its latest.json:
    (tmp_path / "latest.json").write_text(latest_json)
    info = checkpoints.latest(uri)
    assert info is not None and info.epoch == 1


def test_nothing_committed_is_a_fresh_start_and_all_damaged_is_an_error(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    partial = tmp_path / "c" / "epoch-0001"
    partial.mkdir(parents=True)
    (partial / "ckpt.index").write_text("killed while writing the first checkpoint")
    assert checkpoints.latest(str(tmp_path / "c")) is None
    assert checkpoints.latest(str(tmp_path / "none")) is None

    uri = str(tmp_path / "d")
    for epoch in (1, 2):
        checkpoints.save(_FakeCheckpoint(), uri, epoch, {}, "small")
    for epoch in (1, 2):
        (tmp_path / "d" / f"epoch-000{epoch}" / DATA).write_text("")
    with pytest.raises(checkpoints.CheckpointError) as info:
        checkpoints.latest(uri)
    assert str(info.value) == (
        f"checkpoints were written to {uri}, but none can be resumed from: checkpoint after "
        f"epoch 2 is unreadable ({DATA} has 0 bytes, 700 were written); checkpoint after "
        f"epoch 1 is unreadable ({DATA} has 0 bytes, 700 were written). Not starting from "
        "scratch: restore the checkpoints, or start the run in a fresh output (or checkpoint) "
        "directory"
    )
    assert _fallback_lines(caplog) == []
