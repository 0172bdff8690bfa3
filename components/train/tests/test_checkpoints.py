"""The checkpoint marker records which model was trained; a run of another model will not
resume from it."""

from __future__ import annotations

import json
from pathlib import Path

from components.train import checkpoints


class _FakeCheckpoint:
    """Stands in for ``tf.train.Checkpoint``: writes one file where the real one writes its."""

    def write(self, prefix: str) -> None:
        Path(prefix + ".index").write_text("index")


def test_marker_records_the_model_and_refuses_another(tmp_path: Path) -> None:
    uri = str(tmp_path / "checkpoints")
    checkpoints.save(_FakeCheckpoint(), uri, 2, {"loss": 0.5}, "small")
    marker = json.loads((tmp_path / "checkpoints" / "latest.json").read_text())
    assert marker == {"epoch": 2, "prefix": "epoch-0002/ckpt", "metrics": {"loss": 0.5},
                      "model": "small"}  # fmt: skip
    info = checkpoints.latest(uri)
    assert info is not None and info.model == "small"
    assert info.model_problem("small", uri) is None
    assert info.model_problem("mnist_advanced", uri) == (
        f"the checkpoints at {uri} were written training model 'small', and this run trains "
        "'mnist_advanced': resume with model='small', or start the run in a fresh output (or "
        "checkpoint) directory"
    )


def test_a_marker_from_before_the_choice_was_written_training_small(tmp_path: Path) -> None:
    (tmp_path / "latest.json").write_text(json.dumps({"epoch": 1, "prefix": "epoch-0001/ckpt"}))
    info = checkpoints.latest(str(tmp_path))
    assert info is not None and info.model == "small"
    assert info.model_problem("small", str(tmp_path)) is None
    assert "written training model 'small'" in str(info.model_problem("mnist_advanced", "c"))
