"""Checkpoints kept by tf.train.CheckpointManager and uploaded to a local folder or gs:// (real
TensorFlow, a real Keras 3 model and optimizer, the real GCS client on fake-gcs-server): a
restore brings back the model and the optimizer's state; the last two are kept; a damaged newest
checkpoint (or state file) falls back to the one before, saying so once; a save cut short
resumes from the one before; all unusable stops the run."""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from components.common import keras_env, storage
from components.train.rank import checkpoints
from components.train.rank.adam import fused_adam
from components.train.rank.model import build_model
from standins.outputs import half_written

DATA = "ckpt-3.data-00000-of-00001"
INDEX = "ckpt-3.index"


def _trainee(seed: int) -> tuple[Any, Any, Any]:
    """A small real model and its Adam, built (every slot made); their checkpoint."""
    keras_env.keras()
    model = build_model(seed, "small")
    optimizer = fused_adam(learning_rate=0.01)
    model.compile(optimizer=optimizer, loss="sparse_categorical_crossentropy")
    optimizer.build(model.trainable_variables)
    return model, optimizer, checkpoints.new_checkpoint(model, optimizer)


def _train(model: Any, steps: int, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    images = rng.integers(0, 256, (16, 28, 28, 1), dtype=np.uint8)
    labels = rng.integers(0, 10, 16)
    model.fit(images, labels, batch_size=8, epochs=steps, verbose=0)


def _values(variables: list[Any]) -> list[np.ndarray]:
    return [np.array(v.numpy()) for v in variables]


@pytest.fixture(params=["local", "gcs"])
def where(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "local":
        return str(tmp_path / "checkpoints")
    return f"gs://{request.getfixturevalue('gcs_bucket')}/run/checkpoints"


@pytest.fixture(scope="module")
def trained() -> tuple[Any, Any, Any]:
    model, optimizer, ckpt = _trainee(3)
    _train(model, 2)
    return model, optimizer, ckpt


def _save_epochs(ckpt: Any, uri: str, workdir: Path, epochs: range) -> checkpoints.Saver:
    saver = checkpoints.Saver(ckpt, uri, workdir)
    for epoch in epochs:
        saver.save(epoch, {"loss": 1 / epoch}, "small")
    return saver


@pytest.fixture
def three_epochs(where: str, trained: tuple[Any, Any, Any], tmp_path: Path) -> str:
    _save_epochs(trained[2], where, tmp_path / "rank0", range(1, 4))
    return where


def _fallback_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "components.train.rank.checkpoints"]


def test_a_restore_brings_back_the_model_and_the_optimizer_state(
    three_epochs: str, trained: tuple[Any, Any, Any], tmp_path: Path
) -> None:
    """Keras 3's variables are tracked by tf.train.Checkpoint: the weights, and Adam's step
    count and moments, come back in a model and optimizer built from another seed."""
    model, optimizer, _ = trained
    restored, restored_optimizer, ckpt = _trainee(4)
    assert int(restored_optimizer.iterations.numpy()) == 0
    assert not np.array_equal(restored.get_weights()[0], model.get_weights()[0])
    info = checkpoints.latest(three_epochs, workdir=tmp_path / "other-rank")
    assert info is not None and info.epoch == 3
    checkpoints.restore(ckpt, three_epochs, info, tmp_path / "another-rank")
    assert int(restored_optimizer.iterations.numpy()) == int(optimizer.iterations.numpy()) == 4
    for a, b in zip(
        _values(optimizer.variables), _values(restored_optimizer.variables), strict=True
    ):
        np.testing.assert_array_equal(a, b)
    for a, b in zip(model.get_weights(), restored.get_weights(), strict=True):
        np.testing.assert_array_equal(a, b)


def test_a_checkpoint_of_another_model_does_not_restore_in_part(
    three_epochs: str, tmp_path: Path
) -> None:
    info = checkpoints.latest(three_epochs)
    assert info is not None
    keras = keras_env.keras()
    other = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    optimizer = fused_adam(learning_rate=0.01)
    other.compile(optimizer=optimizer, loss="mse")
    optimizer.build(other.trainable_variables)
    with pytest.raises(checkpoints.CheckpointError, match="does not fit the model and optimizer"):
        checkpoints.restore(
            checkpoints.new_checkpoint(other, optimizer), three_epochs, info, tmp_path
        )


def test_the_last_two_are_kept_and_the_newest_is_chosen(
    three_epochs: str, caplog: pytest.LogCaptureFixture
) -> None:
    assert storage.relative_files(three_epochs) == [
        "checkpoint",
        "ckpt-2.data-00000-of-00001",
        "ckpt-2.index",
        "ckpt-3.data-00000-of-00001",
        "ckpt-3.index",
    ]
    info = checkpoints.latest(three_epochs)
    assert info == checkpoints.CheckpointInfo(3, "ckpt-3", {"loss": 1 / 3}, "small")
    assert _fallback_lines(caplog) == []


def test_a_resumed_run_goes_on_keeping_the_last_two(
    three_epochs: str, trained: tuple[Any, Any, Any], tmp_path: Path
) -> None:
    """Another pod's manager goes on from the state file: its first save lets epoch 2 go."""
    _save_epochs(trained[2], three_epochs, tmp_path / "another-pod", range(4, 5))
    assert [f for f in storage.relative_files(three_epochs) if f.endswith(".index")] == [
        "ckpt-3.index",
        "ckpt-4.index",
    ]
    info = checkpoints.latest(three_epochs)
    assert info is not None and info.epoch == 4


def test_the_model_trained_is_recorded_and_another_refused(three_epochs: str) -> None:
    info = checkpoints.latest(three_epochs)
    assert info is not None and info.model == "small"
    assert info.resume_problem("small", three_epochs) is None
    assert info.resume_problem("mnist_advanced", three_epochs) == (
        f"the checkpoints at {three_epochs} were written training model 'small', and this run "
        "trains 'mnist_advanced': resume with model='small', or start the run in a fresh output "
        "(or checkpoint) directory"
    )


def _write(uri: str, data: bytes) -> None:
    storage.write_bytes(uri, data)


def _cut(uri: str) -> None:
    data = storage.read_bytes(uri)
    _write(uri, data[: len(data) // 2])


def _flip(uri: str) -> None:
    data = bytearray(storage.read_bytes(uri))
    data[len(data) // 2] ^= 0xFF
    _write(uri, bytes(data))


EPOCH_3 = "checkpoint after epoch 3 is unreadable ("
UNREADABLE = f"{EPOCH_3}TensorFlow cannot read it: "


@pytest.mark.parametrize(
    ("damage", "epoch", "said"),
    [
        (lambda u: _cut(f"{u}/{DATA}"), 2, f"{UNREADABLE}Read less bytes than requested); "),
        (lambda u: _flip(f"{u}/{DATA}"), 2, f"{UNREADABLE}TensorBundle at ckpt-3 shard 0 ("),
        (lambda u: storage.remove_file(f"{u}/{DATA}"), 2, f"{UNREADABLE}{DATA}; No such file"),
        (lambda u: storage.remove_file(f"{u}/{INDEX}"), 2, f"{EPOCH_3}{INDEX} is missing); "),
        (
            lambda u: [storage.remove_file(f"{u}/{f}") for f in (DATA, INDEX)],
            2,
            f"{EPOCH_3}its files are missing); ",
        ),
        (lambda u: _write(f"{u}/{INDEX}", b"junk"), 2, f"{UNREADABLE}file is too short"),
        # the state file unreadable: the newest checkpoint that reads whole
        (
            lambda u: _write(f"{u}/checkpoint", b'model_checkpoint_path: "ckpt-'),
            3,
            "the state file checkpoint is unreadable: ",
        ),
    ],
    ids=[
        "truncated",
        "corrupt",
        "data-deleted",
        "index-deleted",
        "files-deleted",
        "index-corrupt",
        "state-corrupt",
    ],
)
def test_a_damaged_checkpoint_is_passed_over_in_one_line(
    three_epochs: str,
    caplog: pytest.LogCaptureFixture,
    damage: Callable[[str], Any],
    epoch: int,
    said: str,
) -> None:
    damage(three_epochs)
    info = checkpoints.latest(three_epochs)
    assert info is not None and (info.epoch, info.metrics) == (epoch, {"loss": 1 / epoch})
    (line,) = _fallback_lines(caplog)
    assert line.startswith(said) and line.endswith(f"; resuming from epoch {epoch}"), line


@pytest.fixture
def cut_short(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[int], None]]:
    """`cut(n)`: the storage writes and deletes after the first `n` fail, as if rank 0 were
    killed there (stands in for the kill: the order of the writes is what is tested)."""
    done, limit = [0], [10**9]

    class Killed(Exception):
        pass

    def counted(real: Callable[..., None]) -> Callable[..., None]:
        def call(*args: Any) -> None:
            if done[0] >= limit[0]:
                raise Killed
            done[0] += 1
            real(*args)

        return call

    monkeypatch.setattr(storage, "upload_file", counted(storage.upload_file))
    monkeypatch.setattr(storage, "remove_file", counted(storage.remove_file))

    def cut(n: int) -> None:
        done[0], limit[0] = 0, n

    yield cut


@pytest.mark.parametrize("writes", range(6))
def test_a_save_cut_short_resumes_from_the_last_complete_checkpoint(
    writes: int,
    where: str,
    trained: tuple[Any, Any, Any],
    tmp_path: Path,
    cut_short: Callable[[int], None],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Epoch 3's save: its data file, its index, the state file, then epoch 1's data file and
    index deleted; cut after each: epoch 2 until the state file is written, epoch 3 after; only
    a data file without its index is left half-written."""
    saver = _save_epochs(trained[2], where, tmp_path / "rank0", range(1, 3))
    cut_short(writes)
    try:
        saver.save(3, {"loss": 1 / 3}, "small")
    except Exception as exc:
        assert type(exc).__name__ == "Killed" and writes < 5
    info = checkpoints.latest(where)
    assert info is not None and info.epoch == (3 if writes >= 3 else 2)
    assert _fallback_lines(caplog) == []
    assert half_written(where) == ([DATA] if writes == 1 else [])


def test_a_checkpoint_written_after_the_state_file_is_not_committed(
    where: str, trained: tuple[Any, Any, Any], tmp_path: Path
) -> None:
    saver = _save_epochs(trained[2], where, tmp_path / "rank0", range(1, 2))
    state = storage.read_bytes(f"{where}/checkpoint")
    saver.save(2, {}, "small")  # killed before its state file:
    storage.write_bytes(f"{where}/checkpoint", state)
    info = checkpoints.latest(where)
    assert info is not None and info.epoch == 1


def test_nothing_committed_is_a_fresh_start_and_all_damaged_is_an_error(
    trained: tuple[Any, Any, Any], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    partial = tmp_path / "c"
    partial.mkdir()
    (partial / "ckpt-1.data-00000-of-00001").write_text("killed while writing the first one")
    assert checkpoints.latest(str(partial)) is None
    assert checkpoints.latest(str(tmp_path / "none")) is None

    uri = str(tmp_path / "d")
    _save_epochs(trained[2], uri, tmp_path / "rank0", range(1, 3))
    for epoch in (1, 2):
        (tmp_path / "d" / f"ckpt-{epoch}.data-00000-of-00001").write_bytes(b"")
    with pytest.raises(checkpoints.CheckpointError) as info:
        checkpoints.latest(uri)
    unreadable = "is unreadable (TensorFlow cannot read it: Read less bytes than requested)"
    assert str(info.value) == (
        f"checkpoints were written to {uri}, but none can be resumed from: checkpoint after "
        f"epoch 2 {unreadable}; checkpoint after epoch 1 {unreadable}. Not starting from "
        "scratch: restore the checkpoints, or start the run in a fresh output (or checkpoint) "
        "directory"
    )
    assert _fallback_lines(caplog) == []


def test_checkpoints_of_the_earlier_layout_are_refused_by_name(tmp_path: Path) -> None:
    """latest.json and epoch-NNNN/ (the tf-keras trainer's, and this one's before the manager):
    refused before anything is built, never taken for a fresh start."""
    (tmp_path / "epoch-0001").mkdir()
    (tmp_path / "epoch-0001" / "ckpt.index").write_text("index")
    (tmp_path / "latest.json").write_text('{"epoch": 1, "prefix": "epoch-0001/ckpt"}')
    with pytest.raises(checkpoints.CheckpointError) as info:
        checkpoints.latest(str(tmp_path))
    assert str(info.value) == (
        f"the checkpoints at {tmp_path} were written by an earlier trainer (latest.json and "
        "epoch-NNNN/ folders: the tf-keras trainer's, or this one's before "
        "tf.train.CheckpointManager kept them), which this one cannot resume from: start the "
        "run in a fresh output (or checkpoint) directory"
    )
    shutil.rmtree(tmp_path / "epoch-0001")
    with pytest.raises(checkpoints.CheckpointError, match="written by an earlier trainer"):
        checkpoints.latest(str(tmp_path))


def test_a_checkpoint_gone_since_the_listing_is_passed_over_in_one_line(
    three_epochs: str, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reader beside a running job (a test polling it, a rank of an elastic job joining): the
    newest checkpoint's data file is removed between the listing and its download, as another
    save's rotation removes it; the removal is done here by wrapping the storage layer's
    download, the one stand-in."""
    real = storage.download_file
    gone = storage.join(three_epochs, "ckpt-3.data-00000-of-00001")

    def rotated_away(uri: str, local: Path) -> None:
        if uri == gone:
            storage.remove_file(gone)
        real(uri, local)

    monkeypatch.setattr(storage, "download_file", rotated_away)
    info = checkpoints.latest(three_epochs)
    assert info is not None and info.epoch == 2
    (line,) = _fallback_lines(caplog)
    assert line.startswith("checkpoint after epoch 3 is unreadable (a file of it is gone"), line
    assert line.endswith("; resuming from epoch 2"), line
