"""The prepared dataset: what data prep writes and the trainer and evaluate stream (a
``manifest.json`` and the TFRecord shard files it lists). Runs in the data prep, train and
evaluate steps' pods and in each rank.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from components.common import storage
from components.common.failure import InputError
from components.common.storage import sha256_bytes

# Each record is a ``tf.train.Example`` of one image, its pixels as raw ``uint8`` bytes in row-major
# (height, width, channels) order under ``image/encoded``, and its class index under
# ``image/class/label``. Every image of a dataset has the manifest's height and width; in a
# 3-channel dataset a record may hold one channel (a grayscale image of a colour source, under
# ``color_mode=auto``), which readers repeat into three, as ``tf.image.grayscale_to_rgb`` does.
#
# The manifest is written last, once every shard is checked: a dataset exists once its manifest
# does. It names the image shape, the class names (a label is an index into them), the source, the
# images skipped, and for each split its count, each class's count, and its shards in order (their
# location, record count and sha256). A shard's location is relative to the manifest's folder when
# the shard is below it, else a full URI: data prep on KFP writes each slice's shards into that
# task's own artifact, and the dataset artifact holds the manifest alone, so the steps that take the
# dataset as input download a small file, not the data. Samples are numbered in the order of the
# shards, as the trainer's sharding reads them.
FORMAT = "kfp-horovod/image-tfrecords/v1"
MANIFEST = "manifest.json"
SPLITS = ("train", "test")
IMAGE_FEATURE = "image/encoded"
LABEL_FEATURE = "image/class/label"


class DataError(InputError):
    """Bad or missing data. The message names the file and the problem."""


@dataclass(frozen=True)
class ImageSpec:
    """Every image of a dataset: its height, width and channels (1: grayscale, 3: RGB)."""

    height: int
    width: int
    channels: int

    @property
    def shape(self) -> tuple[int, int, int]:
        return (self.height, self.width, self.channels)

    @property
    def pixels(self) -> int:
        """Bytes of one image at this shape."""
        return self.height * self.width * self.channels

    def describe(self) -> str:
        colour = {1: "grayscale", 3: "RGB"}.get(self.channels, f"{self.channels} channels")
        return f"{self.height}x{self.width} {colour}"


@dataclass(frozen=True)
class ShardFile:
    """One TFRecord file of a split, as the manifest lists it."""

    location: str  # relative to the manifest's folder, or a full URI
    count: int
    sha256: str


@dataclass(frozen=True)
class Manifest:
    root: str  # the manifest's folder
    image: ImageSpec
    classes: tuple[str, ...]
    splits: dict[str, list[ShardFile]]
    raw: dict[str, Any]
    sha256: str  # of the manifest as written: the dataset's identity

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    def count(self, split: str) -> int:
        return sum(s.count for s in self.shards(split))

    def shards(self, split: str) -> list[ShardFile]:
        if split not in self.splits:
            raise DataError(f"{storage.join(self.root, MANIFEST)}: no split {split!r}")
        return self.splits[split]

    def uri(self, shard: ShardFile) -> str:
        """Where `shard` is: its location resolved against the manifest's folder."""
        return resolve(self.root, shard.location)


def resolve(root: str, location: str) -> str:
    """`location` as a full path or URI: as it is if it is one, else below `root`."""
    if "://" in location or location.startswith("/"):
        return location
    return storage.join(root, location)


def relative_to(root: str, uri: str) -> str:
    """`uri` relative to `root` when it is below it (the manifest's locations), else `uri`."""
    prefix = root.rstrip("/") + "/"
    return uri[len(prefix) :] if uri.startswith(prefix) else uri


def write_manifest(uri: str, manifest: dict[str, Any]) -> str:
    """Write ``<uri>/manifest.json`` (sorted keys: the same dataset gives the same bytes);
    return its sha256."""
    data = (json.dumps(manifest, indent=2, sort_keys=True) + "\n").encode("utf-8")
    storage.write_bytes(storage.join(uri, MANIFEST), data)
    return sha256_bytes(data)


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
            raise DataError(
                f"{path}: format is {raw.get('format')!r}, expected {FORMAT!r} (prepare the "
                "data again with this version's data prep)"
            )
        image = ImageSpec(**{k: int(raw["image"][k]) for k in ("height", "width", "channels")})
        classes = tuple(str(c) for c in raw["classes"])
        splits = {
            name: [
                ShardFile(str(s["location"]), int(s["count"]), str(s["sha256"]))
                for s in body["shards"]
            ]
            for name, body in raw["splits"].items()
        }
    except DataError:
        raise
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise DataError(f"{path}: not a valid manifest ({type(exc).__name__}: {exc})") from exc
    if image.channels not in (1, 3) or min(image.height, image.width) < 1 or len(classes) < 2:
        raise DataError(f"{path}: not a valid manifest (image {image}, {len(classes)} classes)")
    for name, shards in splits.items():
        empty = next((s for s in shards if s.count < 1), None)
        if empty is not None:
            raise DataError(f"{resolve(uri, empty.location)}: empty shard in split {name!r}")
    return Manifest(uri, image, classes, splits, raw, sha256_bytes(data))


def decode_records(tf: Any, serialized: Any, image: ImageSpec) -> tuple[Any, Any]:
    """A batch of serialized records as ``uint8`` images ``(n, height, width, channels)`` and
    ``int64`` labels ``(n,)``; TensorFlow ops, for a ``tf.data`` map or a function."""
    features = tf.io.parse_example(
        serialized,
        {
            IMAGE_FEATURE: tf.io.FixedLenFeature([], tf.string),
            LABEL_FEATURE: tf.io.FixedLenFeature([], tf.int64),
        },
    )
    encoded, height, width = features[IMAGE_FEATURE], image.height, image.width
    if image.channels == 1:
        pixels = tf.io.decode_raw(encoded, tf.uint8)
        return tf.reshape(pixels, [-1, height, width, 1]), features[LABEL_FEATURE]
    # A 3-channel dataset: a record of one channel is padded to three by decode_raw; its first
    # third is repeated instead.
    pixels = tf.io.decode_raw(encoded, tf.uint8, fixed_length=image.pixels)
    colour = tf.reshape(pixels, [-1, height, width, 3])
    single = tf.reshape(pixels[:, : height * width], [-1, height, width, 1])
    is_single = tf.equal(tf.strings.length(encoded), height * width)
    images = tf.where(is_single[:, None, None, None], tf.repeat(single, 3, axis=3), colour)
    return images, features[LABEL_FEATURE]
