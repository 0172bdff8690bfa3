"""Bad input: one clear line naming what is wrong, exit 2 on every rank, nothing exported.

Each case runs a real 2-rank job. Where the bad file is read by only one rank, the other rank
must still stop (the ranks agree on errors before training) instead of hanging.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest

from components.common import tfrecord
from components.common.dataset import sha256_bytes

pytestmark = pytest.mark.horovod
EARLIER = b"an earlier model"


def _edit_manifest(dataset: Path, edit: Any) -> None:
    manifest = json.loads((dataset / "manifest.json").read_text())
    edit(manifest)
    (dataset / "manifest.json").write_text(json.dumps(manifest))


def _shard(d: Path, k: int) -> str:
    """The k-th train shard's file, below the dataset (the last ones: rank 1 reads them)."""
    return json.loads((d / "manifest.json").read_text())["splits"]["train"]["shards"][k]["location"]


def _rewrite_shard(d: Path, k: int, records: list[bytes]) -> str:
    """Shard k holding `records` instead, its manifest entry fixed so only the content is bad."""
    rel = _shard(d, k)
    data = b"".join(tfrecord.frame(r) for r in records)
    (d / rel).write_bytes(data)

    def fix(manifest: dict[str, Any]) -> None:
        entry = manifest["splits"]["train"]["shards"][k]
        entry["sha256"], entry["count"] = sha256_bytes(data), len(records)

    _edit_manifest(d, fix)
    return rel


def _corrupt_shard(d: Path) -> str:
    rel = _shard(d, 2)
    raw = bytearray((d / rel).read_bytes())
    raw[-100:] = bytes(100)
    (d / rel).write_bytes(bytes(raw))
    return rf"{re.escape(rel)}: corrupt \(sha256"


def _wrong_shape(d: Path) -> str:
    pixels = {"image/encoded": bytes(28 * 27), "image/class/label": 3}
    rel = _rewrite_shard(d, 3, [tfrecord.example(pixels)] * 100)
    return rf"{re.escape(rel)}: record 0 holds 756 bytes of pixels, not a 28x28 grayscale image"


def _bad_labels(d: Path) -> str:
    pixels = {"image/encoded": bytes(28 * 28), "image/class/label": 12}
    rel = _rewrite_shard(d, 3, [tfrecord.example(pixels)] * 100)
    return rf"{re.escape(rel)}: record 0's label 12 is not one of the manifest's 10 classes"


def _empty_shard(d: Path) -> str:
    rel = _shard(d, 3)
    _edit_manifest(d, lambda m: m["splits"]["train"]["shards"][3].update(count=0))
    return rf"{re.escape(rel)}: empty shard in split 'train'"


def _missing_data(d: Path) -> str:
    (d / "manifest.json").unlink()
    return r"manifest.json: missing"


def _garbage_manifest(d: Path) -> str:
    (d / "manifest.json").write_text("{not json")
    return r"manifest.json: not a valid manifest"


def _too_few_samples(d: Path) -> str:
    """The manifest's train split: the first record of its first shard (a shard's count says
    how many of its first records the split takes)."""

    def one(manifest: dict[str, Any]) -> None:
        train = manifest["splits"]["train"]
        train["shards"] = [dict(train["shards"][0], count=1)]
        train["count"] = 1

    _edit_manifest(d, one)
    return "the train split has 1 samples, fewer than the job's 2 ranks"


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
    [
        _missing_data,
        _garbage_manifest,
        _corrupt_shard,
        _wrong_shape,
        _bad_labels,
        _empty_shard,
        _too_few_samples,
        _model_already_exported,
        _gpus_asked,
    ],
)
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
