"""The dataset format that data prep writes and the trainer and evaluator read: a directory
(local or ``gs://``) of ``manifest.json`` and ``<split>/{images,labels}-NNNNN.npy`` shards.

Images are ``uint8`` ``(n, 28, 28)``, labels ``uint8`` ``(n,)`` in 0..9. ``.npy``, not ``.npz``:
it has no timestamps, so the same data gives the same bytes, and KFP's cache and the manifest's
sha256 values are stable. The manifest lists each split's shards in order (samples are numbered
globally in that order, as the trainer's sharding reads them) with their counts and sha256.
"""

from __future__ import annotations

import io
import json
from dataclasses import dataclass
from typing import Any

import numpy as np

from components.common import storage
from components.common.defaults import IMAGE_SHAPE, NUM_CLASSES
from components.common.failure import InputError
from components.common.storage import sha256_bytes  # re-exported: dataset.sha256_bytes

FORMAT = "kfp-horovod/mnist-shards/v1"
MANIFEST = "manifest.json"
SPLITS = ("train", "test")


class DataError(InputError):
    """Bad or missing data. The message names the file and the problem."""


def validate_arrays(images: Any, labels: Any, where: str) -> tuple[np.ndarray, np.ndarray]:
    """MNIST-format arrays as ``uint8``, or DataError naming `where` and what is wrong."""
    x = np.asarray(images)
    y = np.asarray(labels)
    if x.ndim != 3 or tuple(x.shape[1:]) != IMAGE_SHAPE:
        raise DataError(
            f"{where}: images have shape {tuple(x.shape)}, expected (n, {IMAGE_SHAPE[0]}, "
            f"{IMAGE_SHAPE[1]})"
        )
    if y.ndim != 1:
        raise DataError(f"{where}: labels have shape {tuple(y.shape)}, expected (n,)")
    if len(x) != len(y):
        raise DataError(f"{where}: {len(x)} images but {len(y)} labels")
    if x.dtype.kind not in "uif" or y.dtype.kind not in "uif":
        raise DataError(f"{where}: images are {x.dtype} and labels {y.dtype}; expected numbers")
    if x.dtype.kind == "f" and not np.isfinite(x).all():
        raise DataError(f"{where}: images contain NaN or infinite values")
    # uint8 pixels are in range by construction: skip two full passes over the images.
    if x.dtype != np.uint8 and x.size and (x.min() < 0 or x.max() > 255):
        raise DataError(f"{where}: pixel values span {x.min()}..{x.max()}, expected 0..255")
    if y.dtype.kind == "f" and (not np.isfinite(y).all() or not np.all(y == np.round(y))):
        raise DataError(f"{where}: labels are not whole numbers")
    if y.size and (y.min() < 0 or y.max() >= NUM_CLASSES):
        bad = sorted({int(v) for v in y[(y < 0) | (y >= NUM_CLASSES)]})[:5]
        raise DataError(f"{where}: labels outside 0..{NUM_CLASSES - 1}: {bad}")
    if x.dtype.kind == "f" and x.size and x.max() <= 1.0:
        raise DataError(f"{where}: images look scaled to 0..1; expected raw 0..255 pixels")
    return x.astype(np.uint8, copy=False), y.astype(np.uint8, copy=False)


@dataclass(frozen=True)
class ShardFile:
    """One file shard of a split, as the manifest lists it: its images and labels files."""

    images: str  # path relative to the dataset root
    labels: str
    count: int
    images_sha256: str
    labels_sha256: str


@dataclass(frozen=True)
class Manifest:
    root: str
    splits: dict[str, list[ShardFile]]
    raw: dict[str, Any]
    sha256: str  # of the manifest as written: the dataset's identity

    def count(self, split: str) -> int:
        return sum(s.count for s in self.shards(split))

    def shards(self, split: str) -> list[ShardFile]:
        if split not in self.splits:
            raise DataError(f"{storage.join(self.root, MANIFEST)}: no split {split!r}")
        return self.splits[split]


def write_dataset(
    uri: str,
    splits: dict[str, tuple[np.ndarray, np.ndarray]],
    source: dict[str, Any],
    shard_size: int,
) -> dict[str, Any]:
    """Write `splits` (arrays as `validate_arrays` returns them) as shards, then ``manifest.json``;
    return the manifest."""
    manifest: dict[str, Any] = {"format": FORMAT, "source": source, "splits": {}}
    for name, (x, y) in splits.items():
        if len(x) == 0:
            raise DataError(f"{source.get('uri', 'source')} [{name}]: the split is empty")
        shards = []
        for index, start in enumerate(range(0, len(x), shard_size)):
            xi, yi = x[start : start + shard_size], y[start : start + shard_size]
            entry: dict[str, Any] = {"count": int(len(xi))}
            for kind, array in (("images", xi), ("labels", yi)):
                rel = f"{name}/{kind}-{index:05d}.npy"
                buffer = io.BytesIO()
                np.save(buffer, np.ascontiguousarray(array), allow_pickle=False)
                data = buffer.getvalue()
                storage.write_bytes(storage.join(uri, rel), data)
                entry[kind] = rel
                entry[f"{kind}_sha256"] = sha256_bytes(data)
            shards.append(entry)
        histogram = np.bincount(y, minlength=NUM_CLASSES)
        manifest["splits"][name] = {
            "count": int(len(x)),
            "shards": shards,
            "label_histogram": {str(k): int(v) for k, v in enumerate(histogram)},
        }
    storage.write_text(storage.join(uri, MANIFEST), json.dumps(manifest, indent=2, sort_keys=True))
    return manifest


def read_manifest(uri: str) -> Manifest:
    """The checked ``<uri>/manifest.json``, or DataError naming the file."""
    path = storage.join(uri, MANIFEST)
    try:
        data = storage.read_bytes(path)
    except FileNotFoundError as exc:
        raise DataError(f"{path}: missing (is {uri} a dataset written by data prep?)") from exc
    try:
        raw = json.loads(data)
        if raw.get("format") != FORMAT:
            raise DataError(f"{path}: format is {raw.get('format')!r}, expected {FORMAT!r}")
        splits = {
            name: [
                ShardFile(**{k: s[k] for k in ShardFile.__dataclass_fields__})
                for s in body["shards"]
            ]
            for name, body in raw["splits"].items()
        }
        empty = [(name, s.images) for name, shards in splits.items() for s in shards if s.count < 1]
    except DataError:
        raise
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise DataError(f"{path}: not a valid manifest ({type(exc).__name__}: {exc})") from exc
    if empty:
        name, images = empty[0]
        raise DataError(f"{storage.join(uri, images)}: empty shard in split {name!r}")
    return Manifest(root=uri, splits=splits, raw=raw, sha256=sha256_bytes(data))


def _read_verified(root: str, rel: str, expected_sha256: str) -> np.ndarray:
    """The array in ``<root>/<rel>``, its bytes checked against the manifest's sha256."""
    path = storage.join(root, rel)
    try:
        data = storage.read_bytes(path)
    except FileNotFoundError as exc:
        raise DataError(f"{path}: missing") from exc
    actual = sha256_bytes(data)
    if actual != expected_sha256:
        raise DataError(
            f"{path}: corrupt (sha256 {actual[:12]}…, manifest says {expected_sha256[:12]}…)"
        )
    try:
        return np.load(io.BytesIO(data), allow_pickle=False)
    except Exception as exc:  # numpy raises ValueError, OSError, EOFError... for bad bytes
        raise DataError(f"{path}: not a readable .npy file ({exc})") from exc


def load_range(
    manifest: Manifest, split: str, start: int = 0, stop: int | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Samples ``[start, stop)`` of `split` (by default all of it), from only the shards that
    overlap it, each checked against its sha256 and validated."""
    total = manifest.count(split)
    stop = total if stop is None else stop
    if not 0 <= start <= stop <= total:
        raise ValueError(f"range [{start}, {stop}) outside split {split!r} of {total} samples")
    xs, ys = [], []
    offset = 0
    for shard in manifest.shards(split):
        lo, hi = max(start, offset), min(stop, offset + shard.count)
        if lo < hi:
            x = _read_verified(manifest.root, shard.images, shard.images_sha256)
            y = _read_verified(manifest.root, shard.labels, shard.labels_sha256)
            where = storage.join(manifest.root, shard.images)
            if len(x) != shard.count:
                raise DataError(f"{where}: {len(x)} samples, manifest says {shard.count}")
            x, y = validate_arrays(x, y, where)
            xs.append(x[lo - offset : hi - offset])
            ys.append(y[lo - offset : hi - offset])
        offset += shard.count
    if not xs:
        return np.zeros((0, *IMAGE_SHAPE), np.uint8), np.zeros((0,), np.uint8)
    return np.concatenate(xs), np.concatenate(ys)
