"""The TensorBoard writer on local disk and on fake-gcs-server (the real GCS client): after every
write the log directory holds the run's event file as written so far, which TensorBoard's own
reader reads back epoch by epoch."""

from __future__ import annotations

from pathlib import Path

from components.common import storage
from components.common.board import Board
from components.common.keras_env import tensorflow
from tests.test_e2e_local import read_scalars


def test_every_write_reaches_the_log_directory_readable_by_tensorboard(
    storage_root: str, tmp_path: Path
) -> None:
    uri = storage.join(storage_root, "tensorboard")
    board = Board(tensorflow(), uri, "train", tmp_path / "work")
    for epoch in (1, 2, 3):
        board.write(epoch, {"loss": 0.5**epoch, "accuracy": 0.25 * epoch})
        (local,) = (tmp_path / "work" / "tensorboard" / "train").iterdir()  # one file a run
        assert storage.list_files(uri) == [storage.join(uri, "train", local.name)]
        assert storage.read_bytes(storage.join(uri, "train", local.name)) == local.read_bytes()
    copy = storage.download_dir(uri, tmp_path / "copy")
    assert read_scalars(copy)["train"] == {
        "accuracy": [(1, 0.25), (2, 0.5), (3, 0.75)],
        "loss": [(1, 0.5), (2, 0.25), (3, 0.125)],  # float32: exact
    }
