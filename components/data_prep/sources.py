"""What data prep reads (``data_format``: bundled, npz, folder, csv, tfrecord), and the listing of
each source: its classes and its images, each with its split and label, before any image is
decoded. Runs in the data prep list task's pod, or in `prepare`'s process.
"""

from __future__ import annotations

import csv
import fnmatch
import hashlib
import io
import os
import urllib.error
import urllib.request
from collections import Counter
from dataclasses import dataclass, field
from importlib import resources
from pathlib import PurePosixPath
from typing import Any

import numpy as np

from components.common import storage, tfrecord
from components.common.dataset import DataError
from components.common.defaults import BUNDLED_SOURCE, MNIST_SHA256, SPLIT_SEED, TEST_FRACTION
from components.common.images import EXTENSIONS
from components.common.storage import sha256_bytes

# Sources (``data_format``; ``auto`` tells them apart, `detect`):
#
# - ``bundled``: the 5,000 real MNIST digits shipped in this package, split by a seeded shuffle.
# - ``npz``: an ``mnist.npz``-style file (``x_train``, ``y_train``, ``x_test``, ``y_test``) by path,
#   ``gs://`` URI or http(s) URL, its sha256 checked.
# - ``folder``: one subfolder per class, the layout of Keras's ``image_dataset_from_directory``;
#   class names are the subfolders' names, sorted; images are found in each class's whole tree.
# - ``csv``: an index of ``[ML_USE,]URI,LABEL`` rows, Vertex AI's import format for image
#   classification; a URI may also be a path relative to the index's folder.
# - ``tfrecord``: TFRecord files of ``tf.train.Example`` (a file, a folder or a glob), each record
#   holding an encoded image and an integer label.
#
# The split is deterministic and stable as a source grows: an image goes to the test split when the
# hash of its path (a TFRecord record: its file's name and its index) falls below ``test_fraction``,
# unless the source says (an index's ML_USE, an npz's arrays). Images are listed in the order of the
# same hash, so the classes of a folder are mixed across the shards and across the ranks that read
# them.
#
# The bundled digits: uint8 `images` (5000, 28, 28) and `labels` (5000,), sorted by label.
BUNDLED_FILE = "data/mnist_5k.npz"
TFRECORD_SUFFIXES = (".tfrecord", ".tfrecords", ".tfrec")
ML_USE = {"training": "train", "train": "train", "test": "test", "validation": "validation"}
GLOB = ("*", "?", "[")


@dataclass(frozen=True)
class Item:
    """One thing a slice converts: an image file (`uri`, with its `split` and `label`), a row of
    the source's arrays (`row`), or a TFRecord file (`uri`; each record's split and label are
    its own, and `keep`, when given, is how many records of each split it keeps, first
    first)."""

    name: str  # what a message calls it: the path below the source, "row N", the file's name
    split: str = ""
    label: int = -1
    uri: str = ""
    row: int = -1
    keep: dict[str, int] | None = None
    weight: int = 1  # its share of a slice's work: a TFRecord file's bytes, else 1

    def to_json(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if v not in ("", -1, None)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Item:
        return cls(**data)


@dataclass
class Listing:
    """A source's classes and items in the dataset's order (`classes` None: a TFRecord
    source's, known once its records are read), its arrays (array sources), and what the
    manifest records of it."""

    kind: str
    source: dict[str, Any]
    classes: list[str] | None
    items: list[Item]
    arrays: tuple[np.ndarray, np.ndarray] | None = None
    counts: dict[str, int] = field(default_factory=dict)  # images per split, where known


def detect(source: str, data_format: str = "auto") -> str:
    """The source's kind: `data_format`, or for ``auto`` what its name or content says."""
    if data_format != "auto":
        return data_format
    if source in ("bundled", BUNDLED_SOURCE):
        return "bundled"
    lowered = source.lower().rstrip("/")
    if source.startswith(("http://", "https://")) or lowered.endswith(".npz"):
        return "npz"
    if lowered.endswith(".csv"):
        return "csv"
    if any(c in source for c in GLOB) or _is_tfrecord_name(lowered):
        return "tfrecord"
    files = _files_below(source)
    if any("/" in rel for rel in files):
        return "folder"
    if files and all(_is_tfrecord_name(rel.lower()) for rel in files):
        return "tfrecord"
    if not files and not storage.is_gcs(source) and os.path.isdir(source):
        raise DataError(
            f"{source}: an empty folder, with no class subfolders (an image folder's layout is "
            f"{source}/<class>/<image>)"
        )
    if not files:
        raise DataError(f"{source}: no such file or folder")
    raise DataError(
        f"{source}: cannot tell what it holds (no class subfolders, no TFRecord file names): "
        "set data_format to folder, csv, tfrecord or npz"
    )


def _is_tfrecord_name(name: str) -> bool:
    base = PurePosixPath(name).name
    return base.endswith(TFRECORD_SUFFIXES) or ".tfrecord-" in base


def _files_below(uri: str) -> list[str]:
    """Every file below `uri` (relative paths, sorted); [] for a file or a missing path."""
    if not storage.is_gcs(uri) and not os.path.isdir(uri):
        return []
    return [rel for rel in storage.relative_files(uri) if not _hidden(rel)]


def _hidden(rel: str) -> bool:
    return any(part.startswith(".") for part in rel.split("/"))


def hash_fraction(key: str) -> float:
    """A stable number in [0, 1) for `key`: a split decision that no other image changes."""
    return int(hashlib.sha256(key.encode("utf-8")).hexdigest()[:12], 16) / 16**12


def split_of(key: str, test_fraction: float) -> str:
    return "test" if hash_fraction(key) < test_fraction else "train"


def list_source(
    source: str,
    data_format: str = "auto",
    sha256: str | None = MNIST_SHA256,
    limit: int = 0,
    test_fraction: float = 0.2,
) -> Listing:
    """The listing of `source` (DataError naming the file, the row or the class that is
    wrong); with `limit`, only the first `limit` images of each split."""
    kind = detect(source, data_format)
    if kind == "bundled":
        listing = _bundled(test_fraction)
    elif kind == "npz":
        listing = _npz(source, sha256)
    elif kind == "folder":
        listing = _folder(source, test_fraction)
    elif kind == "csv":
        listing = _csv(source, test_fraction)
    else:
        return _tfrecords(source, test_fraction, limit)
    if limit:
        taken: Counter[str] = Counter()
        kept = []
        for item in listing.items:
            taken[item.split] += 1
            if taken[item.split] <= limit:
                kept.append(item)
        listing.items = kept
        listing.source["limit"] = limit
    listing.counts = dict(Counter(i.split for i in listing.items))
    _check_classes(listing, limit)
    return listing


def _check_classes(listing: Listing, limit: int = 0) -> None:
    """Two classes or more, each with training images."""
    assert listing.classes is not None
    if len(listing.classes) < 2:
        found = f"only the class {listing.classes[0]!r}" if listing.classes else "no classes"
        raise DataError(f"{listing.source['uri']}: {found}; a classifier needs two classes or more")
    trained = {i.label for i in listing.items if i.split == "train"}
    missing = [name for k, name in enumerate(listing.classes) if k not in trained]
    if missing:
        raise DataError(
            f"{listing.source['uri']}: class {missing[0]!r} has no training images"
            + (f" (nor have {len(missing) - 1} more classes)" if len(missing) > 1 else "")
            + (f" among the first {limit} of each split (data_limit)" if limit else "")
        )


# The array sources -----------------------------------------------------------------------------


def _bundled(test_fraction: float, seed: int = SPLIT_SEED) -> Listing:
    """The bundled digits (data/README.md), split after a seeded shuffle (the file is sorted by
    label)."""
    with (
        (resources.files("components.data_prep") / BUNDLED_FILE).open("rb") as f,
        np.load(f) as bundle,
    ):
        images, labels = bundle["images"], bundle["labels"]
    order = np.random.default_rng(seed).permutation(len(labels))
    images, labels = images[order], labels[order]
    n_test = int(round(len(labels) * test_fraction))
    split = ["test"] * n_test + ["train"] * (len(labels) - n_test)
    rows = [*range(n_test, len(labels)), *range(n_test)]  # train first, as the manifest
    items = [Item(f"row {r}", split=split[r], label=int(labels[r]), row=r) for r in rows]
    description = {
        "uri": BUNDLED_SOURCE,
        "format": "bundled",
        "sha256": sha256_bytes(
            images.astype(np.uint8).tobytes() + labels.astype(np.uint8).tobytes()
        ),
        "split_seed": seed,
        "test_fraction": test_fraction,
    }
    return Listing("bundled", description, [str(c) for c in range(10)], items, (images, labels))


def bundled_digits(
    test_fraction: float = TEST_FRACTION,
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """The bundled digits by split, as data prep splits them: ``uint8`` images (n, 28, 28) and
    labels, in the dataset's order (the benchmarks' real digits, `make serve`'s example)."""
    listing = _bundled(test_fraction)
    assert listing.arrays is not None
    images, labels = listing.arrays
    rows = {s: [i.row for i in listing.items if i.split == s] for s in ("train", "test")}
    return {split: (images[r], labels[r]) for split, r in rows.items()}


def fetch(uri: str, timeout_s: float = 60.0) -> bytes:
    """The bytes at an http(s) URL, a ``gs://`` URI or a local path; DataError naming it."""
    if uri.startswith(("http://", "https://")):
        try:
            with urllib.request.urlopen(uri, timeout=timeout_s) as response:  # noqa: S310
                return bytes(response.read())
        except (urllib.error.URLError, OSError) as exc:
            raise DataError(f"{uri}: unreachable ({exc})") from exc
    try:
        return storage.read_bytes(uri)
    except FileNotFoundError as exc:
        raise DataError(f"{uri}: not found") from exc
    except IsADirectoryError as exc:
        raise DataError(f"{uri}: a folder, not an .npz file") from exc
    except Exception as exc:
        raise DataError(f"{uri}: unreadable ({exc})") from exc


def _npz(uri: str, expected_sha256: str | None) -> Listing:
    """An npz of ``x_train, y_train, x_test, y_test``, its sha256 checked unless None."""
    data = fetch(uri)
    digest = sha256_bytes(data)
    if expected_sha256 is not None and digest != expected_sha256.lower():
        raise DataError(
            f"{uri}: sha256 mismatch: got {digest}, expected {expected_sha256} "
            "(corrupt or not the canonical mnist.npz; pass its sha256 as --data-sha256, or "
            "--data-sha256 none not to check it)"
        )
    try:
        with np.load(io.BytesIO(data), allow_pickle=False) as npz:
            missing = {"x_train", "y_train", "x_test", "y_test"} - set(npz.files)
            if missing:
                raise DataError(f"{uri}: missing arrays {sorted(missing)} (found {npz.files})")
            parts = {s: (npz[f"x_{s}"], npz[f"y_{s}"]) for s in ("train", "test")}
    except DataError:
        raise
    except Exception as exc:
        raise DataError(f"{uri}: not a readable .npz file ({exc})") from exc
    checked = {s: validate_arrays(x, y, f"{uri} [{s}]") for s, (x, y) in parts.items()}
    if checked["train"][0].shape[1:] != checked["test"][0].shape[1:]:
        raise DataError(
            f"{uri}: train images are {checked['train'][0].shape[1:]} and test images "
            f"{checked['test'][0].shape[1:]}; a dataset has one image shape"
        )
    images = np.concatenate([checked["train"][0], checked["test"][0]])
    labels = np.concatenate([checked["train"][1], checked["test"][1]])
    n_train = len(checked["train"][1])
    items = []
    for r in range(len(labels)):
        split, array, k = (
            ("train", "x_train", r) if r < n_train else ("test", "x_test", r - n_train)
        )
        items.append(Item(f"{array}[{k}]", split=split, label=int(labels[r]), row=r))
    classes = [str(c) for c in range(int(labels.max()) + 1)] if len(labels) else []
    description = {"uri": uri, "format": "npz", "sha256": digest}
    return Listing("npz", description, classes, items, (images, labels))


def validate_arrays(images: Any, labels: Any, where: str) -> tuple[np.ndarray, np.ndarray]:
    """An npz's arrays as ``uint8`` images (n, height, width[, 1 or 3]) and ``int64`` labels
    from 0, or DataError naming `where` and what is wrong."""
    x, y = np.asarray(images), np.asarray(labels)
    if x.ndim not in (3, 4) or (x.ndim == 4 and x.shape[3] not in (1, 3)):
        raise DataError(
            f"{where}: images have shape {tuple(x.shape)}, expected (n, height, width) or "
            "(n, height, width, 1 or 3)"
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
    if y.size and y.min() < 0:
        raise DataError(f"{where}: negative labels {sorted({int(v) for v in y[y < 0]})[:5]}")
    if x.dtype.kind == "f" and x.size and x.max() <= 1.0:
        raise DataError(f"{where}: images look scaled to 0..1; expected raw 0..255 pixels")
    return x.astype(np.uint8, copy=False), y.astype(np.int64, copy=False)


# The file sources ------------------------------------------------------------------------------


def _is_image(name: str) -> bool:
    return name.lower().endswith(EXTENSIONS)


def _ordered(items: list[Item]) -> list[Item]:
    """`items` in the dataset's order: by the hash of their names (the classes mixed)."""
    return sorted(items, key=lambda i: hashlib.sha256(i.name.encode("utf-8")).hexdigest())


def _folder(root: str, test_fraction: float) -> Listing:
    """One subfolder per class (Keras's layout): every image in its tree is of that class."""
    root = root.rstrip("/")
    files = _files_below(root)
    subfolders = {rel.split("/", 1)[0] for rel in files if "/" in rel}
    if not storage.is_gcs(root) and os.path.isdir(root):  # empty class folders show too
        subfolders |= {e.name for e in os.scandir(root) if e.is_dir() and not _hidden(e.name)}
    if not subfolders:
        raise DataError(f"{root}: no class subfolders (the layout is {root}/<class>/<image>)")
    classes = sorted(subfolders)
    index = {name: k for k, name in enumerate(classes)}
    images: dict[str, list[str]] = {name: [] for name in classes}
    for rel in files:
        if "/" in rel and _is_image(rel):
            images[rel.split("/", 1)[0]].append(rel)
    for name in classes:
        if not images[name]:
            raise DataError(
                f"{storage.join(root, name)}: a class folder without images "
                f"({', '.join(EXTENSIONS)})"
            )
    items = [
        Item(
            rel, split=split_of(rel, test_fraction), label=index[name], uri=storage.join(root, rel)
        )
        for name in classes
        for rel in images[name]
    ]
    description = {
        "uri": root,
        "format": "folder",
        "sha256": _listing_sha256(items),
        "test_fraction": test_fraction,
    }
    return Listing("folder", description, classes, _ordered(items))


def _listing_sha256(items: list[Item]) -> str:
    """What identifies a file source's listing: its images' names, splits and labels."""
    lines = sorted(f"{i.name}\t{i.split}\t{i.label}" for i in items)
    return sha256_bytes("\n".join(lines).encode("utf-8"))


def _csv(index_uri: str, test_fraction: float) -> Listing:
    """Rows ``[ML_USE,]URI,LABEL``; ML_USE (training, test, validation) decides a row's split,
    else the hash of its URI as the row writes it. Every file must exist, once."""
    try:
        text = storage.read_text(index_uri)
    except FileNotFoundError as exc:
        raise DataError(f"{index_uri}: no such index file") from exc
    except UnicodeDecodeError as exc:
        raise DataError(f"{index_uri}: not a text file ({exc})") from exc
    folder = index_uri.rsplit("/", 1)[0] if "/" in index_uri else "."
    rows: list[tuple[int, str, str, str]] = []  # (row number, split, uri, label)
    seen: dict[str, int] = {}
    for number, row in enumerate(csv.reader(io.StringIO(text)), start=1):
        cells = [c.strip() for c in row]
        if not any(cells):
            continue
        where = f"{index_uri} row {number}"
        if len(cells) == 3:
            use, uri, label = cells
            split = ML_USE.get(use.lower()) if use else None
            if use and split is None:
                raise DataError(f"{where}: ML_USE {use!r} is not one of training, test, validation")
        elif len(cells) == 2:
            (uri, label), split = cells, None
        else:
            raise DataError(f"{where}: {len(cells)} columns; expected [ML_USE,]URI,LABEL")
        if not label:
            raise DataError(f"{where}: no label")
        if not _is_image(uri):
            raise DataError(f"{where}: {uri!r} is not an image file ({', '.join(EXTENSIONS)})")
        full = uri if "://" in uri or uri.startswith("/") else storage.join(folder, uri)
        if full in seen:
            raise DataError(f"{where}: {uri} is listed again (first in row {seen[full]})")
        seen[full] = number
        rows.append((number, split or split_of(uri, test_fraction), full, label))
    if not rows:
        raise DataError(f"{index_uri}: no rows ([ML_USE,]URI,LABEL)")
    _check_files_exist(index_uri, rows)
    classes = sorted({label for *_, label in rows})
    index = {name: k for k, name in enumerate(classes)}
    items = [Item(uri, split=split, label=index[label], uri=uri) for _, split, uri, label in rows]
    description = {
        "uri": index_uri,
        "format": "csv",
        "sha256": _listing_sha256(items),
        "test_fraction": test_fraction,
    }
    return Listing("csv", description, classes, _ordered(items))


def _check_files_exist(index_uri: str, rows: list[tuple[int, str, str, str]]) -> None:
    """DataError naming the first row whose file is missing (a listing of each folder the index
    names: one request a folder on GCS, not one a file)."""
    present: dict[str, set[str]] = {}
    for number, _, uri, _ in rows:
        folder, _, name = uri.rpartition("/")
        if folder not in present:
            if storage.is_gcs(uri):
                present[folder] = {rel for rel in storage.relative_files(folder) if "/" not in rel}
            else:
                present[folder] = set(os.listdir(folder)) if os.path.isdir(folder) else set()
        if name not in present[folder] or (not storage.is_gcs(uri) and not os.path.isfile(uri)):
            raise DataError(f"{index_uri} row {number}: {uri} does not exist")


def _tfrecords(source: str, test_fraction: float, limit: int) -> Listing:
    """TFRecord files: one item each (its bytes its weight); with `limit`, each file's records
    are counted to keep the first `limit` of each split."""
    files = _tfrecord_files(source)
    sizes = _sizes(files)
    items = []
    taken: Counter[str] = Counter()
    for uri in files:
        name = PurePosixPath(uri).name
        keep: Counter[str] | None = None
        if limit:
            keep = Counter()
            for index in range(_record_count(uri)):
                split = split_of(f"{name}:{index}", test_fraction)
                if taken[split] < limit:
                    taken[split] += 1
                    keep[split] += 1
            if not keep:
                continue
        kept = dict(keep) if keep is not None else None
        items.append(Item(name, uri=uri, keep=kept, weight=max(1, sizes.get(uri, 1))))
    description: dict[str, Any] = {
        "uri": source,
        "format": "tfrecord",
        "files": len(files),
        "test_fraction": test_fraction,
    }
    if limit:
        description["limit"] = limit
    return Listing("tfrecord", description, None, items, counts=dict(taken) if limit else {})


def _tfrecord_files(source: str) -> list[str]:
    """The files of a TFRecord source: itself, the folder's files, or the glob's matches."""
    if any(c in source for c in GLOB):
        base = source[: min(source.index(c) for c in GLOB if c in source)].rpartition("/")[0]
        matched = [
            storage.join(base, rel)
            for rel in (_files_below(base) if base else [])
            if fnmatch.fnmatchcase(storage.join(base, rel), source)
        ]
        if not matched:
            raise DataError(f"{source}: the pattern matches no file")
        return matched
    below = _files_below(source)
    if below:
        return [storage.join(source, rel) for rel in below]
    if storage.exists(source):
        return [source]
    raise DataError(f"{source}: no such file or folder")


def _sizes(files: list[str]) -> dict[str, int]:
    """Bytes of each file (local: stat; GCS: one listing of each folder)."""
    sizes: dict[str, int] = {}
    for uri in files:
        if not storage.is_gcs(uri):
            sizes[uri] = os.path.getsize(uri)
    gcs_folders = {uri.rpartition("/")[0] for uri in files if storage.is_gcs(uri)}
    for folder in gcs_folders:
        sizes.update(
            {storage.join(folder, rel): size for rel, size in storage.sizes(folder).items()}
        )
    return sizes


def _record_count(uri: str) -> int:
    """Records in a TFRecord file, from its framing (DataError if it is not one)."""
    try:
        return tfrecord.count_records(storage.read_bytes(uri))
    except ValueError as exc:
        raise DataError(f"{uri}: not a TFRecord file ({exc})") from exc
