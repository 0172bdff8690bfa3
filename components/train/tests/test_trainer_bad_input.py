"""Bad input: one clear line naming what is wrong, exit 2 on every rank, nothing exported.

Each case runs a real 2-rank job. Where the bad file is read by only one rank, the other rank
must still stop (the ranks agree on errors before training) instead of hanging.
"""

from __future__ import annotations

import io
import json
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from components.common.dataset import sha256_bytes, write_dataset

pytestmark = pytest.mark.horovod
EARLIER = b"an earlier model"


def _replace_array(dataset: Path, rel: str, array: np.ndarray, count: int | None = None) -> None:
    """Swap in a bad array; fix the manifest's sha256 (and count) so only the content is bad."""
    buf = io.BytesIO()
    np.save(buf, array, allow_pickle=False)
    (dataset / rel).write_bytes(buf.getvalue())
    manifest = json.loads((dataset / "manifest.json").read_text())
    for shard in manifest["splits"]["train"]["shards"]:
        for kind in ("images", "labels"):
            if shard[kind] == rel:
                shard[f"{kind}_sha256"] = sha256_bytes(buf.getvalue())
                if count is not None:
                    shard["count"] = count
    (dataset / "manifest.json").write_text(json.dumps(manifest))


def _corrupt_shard(d: Path) -> str:
    raw = bytearray((d / "train/images-00002.npy").read_bytes())
    raw[-100:] = bytes(100)
    (d / "train/images-00002.npy").write_bytes(bytes(raw))
    return r"train/images-00002.npy: corrupt \(sha256"


def _wrong_shape(d: Path) -> str:
    _replace_array(d, "train/images-00003.npy", np.zeros((100, 28, 27), np.uint8))
    return r"train/images-00003.npy: images have shape \(100, 28, 27\), expected \(n, 28, 28\)"


def _bad_labels(d: Path) -> str:
    labels = np.load(d / "train/labels-00000.npy")
    labels[5] = 12
    _replace_array(d, "train/labels-00000.npy", labels)
    return r"train/images-00000.npy: labels outside 0..9: \[12\]"


def _empty_shard(d: Path) -> str:
    _replace_array(d, "train/images-00003.npy", np.zeros((0, 28, 28), np.uint8), count=0)
    return r"train/images-00003.npy: empty shard in split 'train'"


def _missing_data(d: Path) -> str:
    (d / "manifest.json").unlink()
    return r"manifest.json: missing"


def _garbage_manifest(d: Path) -> str:
    (d / "manifest.json").write_text("{not json")
    return r"manifest.json: not a valid manifest"


def _too_few_samples(d: Path) -> str:
    x, y = np.zeros((1, 28, 28), np.uint8), np.zeros((1,), np.uint8)
    shutil.rmtree(d)
    write_dataset(str(d), {"train": (x, y), "test": (x, y)}, {"uri": "test"}, 10)
    return "the train split has 1 samples, so rank 0 of 2 gets an empty shard"


def _model_already_exported(d: Path) -> str:
    (d.parent / "out" / "model").mkdir(parents=True)
    (d.parent / "out" / "model" / "saved_model.pb").write_bytes(EARLIER)
    return "a model is already exported there; refusing to overwrite"


def _gpus_asked(d: Path) -> str:
    """Here, where the environment has none of TensorFlow's CUDA libraries: never a silent
    CPU run."""
    return (
        r"training failed: 2 of 2 ranks cannot train: this job asked for 1 GPU\(s\) per worker, "
        r"but the trainer runs in a CPU image: TensorFlow cannot load libcudart\.so\.12, "
        r".*libcudnn\.so\.9.*\. Use the GPU trainer image \(kfp-horovod-trainer-gpu, which "
        r"gpus_per_worker > 0 selects unless trainer_image names another\), or set "
        r"gpus_per_worker to 0 to train on the CPU$"
    )


@pytest.mark.parametrize(
    "breaker",
    [_missing_data, _garbage_manifest, _corrupt_shard, _wrong_shape, _bad_labels, _empty_shard,
     _too_few_samples, _model_already_exported, _gpus_asked],
)  # fmt: skip
def test_bad_input_fails_clearly_on_every_rank(
    breaker: Any, mnist_1000: str, tmp_path: Path, run_job: Any
) -> None:
    data = Path(shutil.copytree(mnist_1000, tmp_path / "data"))
    expected = breaker(data)
    out = tmp_path / "out"
    args = ["--data", str(data), "--output", str(out), "--workers", "2", "--epochs", "1"]
    gpus = ["--gpus-per-worker", "1"] if breaker is _gpus_asked else []
    proc = run_job(2, [*args, *gpus], timeout=240)  # a hang would time out and fail the test
    assert proc.returncode == 2, proc.stdout + proc.stderr  # our bad-input exit, not a crash
    failed = [line for line in proc.stdout.splitlines() if "training failed: " in line]
    assert len(failed) == 1 and "[rank 0/2] training failed:" in failed[0], proc.stdout
    assert re.search(expected, failed[0]), proc.stdout
    assert not re.search(r"^\[[\d,]+\]<std(out|err)>:Traceback", proc.stdout + proc.stderr, re.M)
    models = list(tmp_path.rglob("saved_model.pb"))  # nothing exported, nothing overwritten
    assert all(p.read_bytes() == EARLIER for p in models)
    kept = [out / "model"] if breaker is _model_already_exported else []
    assert not out.exists() or list(out.iterdir()) == kept, "nothing may be written"
    assert "Epoch 1/" not in proc.stdout
