"""One slice of the listing into TFRecord shards and a part report, which the publish step reads.
Runs in a data prep slice task's pod (one per ``dsl.ParallelFor`` item), or in `prepare`'s
process.
"""

from __future__ import annotations

import io
import re
import warnings
from collections import Counter, defaultdict, deque
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from itertools import islice
from pathlib import PurePosixPath
from typing import Any

import numpy as np

from components.common import dataset, images, keras_env, storage, tfrecord
from components.common.dataset import DataError
from components.data_prep.sources import Item, split_of

# The first bad images a part report names (all are counted).
NAMED_BAD = 10
# Files read ahead of the one being converted (GCS reads overlap; local reads are cheap).
READ_AHEAD = 8
# What TensorFlow's C++ writes to stderr for each image it cannot decode: the error itself is
# raised, and reported once, by name.
DECODE_NOISE = re.compile(
    r"jpeg_mem\.cc|local_rendezvous\.cc|Premature end of JPEG|Input file read error"
)


@dataclass
class Pixels:
    """One image's pixels (uint8, height x width x 1 or 3), label, split and name."""

    array: np.ndarray
    label: int
    split: str
    name: str


@dataclass
class Bad:
    """An image that cannot be used, and why."""

    name: str
    reason: str


@dataclass
class Target:
    """The dataset's image: `size` pixels a side (0: the source's own), `color_mode`."""

    size: int
    color_mode: str

    @property
    def channels(self) -> int | None:
        return {"grayscale": 1, "rgb": 3}.get(self.color_mode)


@dataclass
class Shards:
    """The shard files of one split being written to `folder`, `shard_size` records each."""

    folder: str
    split: str
    slice_index: int
    shard_size: int
    written: list[dict[str, Any]] = field(default_factory=list)
    _buffer: io.BytesIO = field(default_factory=io.BytesIO)
    _writer: tfrecord.RecordWriter | None = None

    def add(self, record: bytes) -> None:
        if self._writer is None:
            self._buffer = io.BytesIO()
            self._writer = tfrecord.RecordWriter(self._buffer)
        self._writer.write(record)
        if self._writer.count >= self.shard_size:
            self.close()

    def close(self) -> None:
        """Write the shard being filled, if any."""
        if self._writer is None:
            return
        name = f"{self.split}-{self.slice_index:05d}-{len(self.written):05d}.tfrecord"
        uri = storage.join(self.folder, name)
        data = self._buffer.getvalue()
        storage.write_bytes(uri, data)
        self.written.append(
            {
                "uri": uri,
                "count": self._writer.count,
                "sha256": self._writer.sha256,
                "crc32c": storage.crc32c_base64(data),
            }
        )
        self._writer = None


# Each image is read, checked, decoded, brought to the dataset's colour and size
# (`components.common.images`), and written as a record of the prepared format
# (`components.common.dataset`); what the slice found goes to its part report.
#
# An image that cannot be used (0 bytes, not an image, truncated, over Pillow's decompression-bomb
# limit) does not stop the slice: it is counted and named in the report, and the publish step
# refuses the dataset unless ``skip_bad_images``, so that the user hears of every bad image at once.
# A TFRecord record without the named features, or with a negative label, stops the slice at once:
# the source's layout is wrong, not one image.
#
# TensorFlow is imported only when an image must be decoded, recoloured or resized: the bundled
# digits at their own size and colour need none of it (`components.common.tfrecord`).
def convert_slice(
    items: list[Item],
    slice_index: int,
    shards_uri: str,
    target: Target,
    arrays: tuple[np.ndarray, np.ndarray] | None = None,
    shard_size: int = 1000,
    image_feature: str = dataset.IMAGE_FEATURE,
    label_feature: str = dataset.LABEL_FEATURE,
    test_fraction: float = 0.2,
) -> dict[str, Any]:
    """Convert `items` into shards under `shards_uri`; return the part report."""
    writers: dict[str, Shards] = {}
    class_counts: dict[str, Counter[int]] = defaultdict(Counter)
    sizes: Counter[str] = Counter()
    size_example: dict[str, str] = {}
    channels: Counter[int] = Counter()
    bad: list[Bad] = []
    bad_count = 0
    read = Reader(target, arrays, image_feature, label_feature, test_fraction)
    with keras_env.stderr_without(DECODE_NOISE):
        for found in read.all(items):
            if isinstance(found, Bad):
                bad_count += 1
                if len(bad) < NAMED_BAD:
                    bad.append(found)
                continue
            height, width, depth = found.array.shape
            size = f"{height}x{width}"
            if target.size == 0 and sizes and size not in sizes:
                first = next(iter(sizes))
                raise DataError(
                    f"images have different sizes: {size_example[first]} is {first}, "
                    f"{found.name} is {size}; set image_size to resize every image to one size"
                )
            sizes[size] += 1
            size_example.setdefault(size, found.name)
            channels[depth] += 1
            class_counts[found.split][found.label] += 1
            if found.split not in writers:
                writers[found.split] = Shards(shards_uri, found.split, slice_index, shard_size)
            record: dict[str, bytes | int] = {
                dataset.IMAGE_FEATURE: found.array.tobytes(),
                dataset.LABEL_FEATURE: found.label,
            }
            writers[found.split].add(tfrecord.example(record))
    for writer in writers.values():
        writer.close()
    return {
        "slice": slice_index,
        "shards": {split: w.written for split, w in sorted(writers.items())},
        "class_counts": {
            split: {str(k): n for k, n in sorted(c.items())} for split, c in class_counts.items()
        },
        "sizes": dict(sizes),
        "size_examples": size_example,
        "channels": {str(k): n for k, n in sorted(channels.items())},
        "bad": [b.__dict__ for b in bad],
        "bad_count": bad_count,
    }


class Reader:
    """Each item's images as `Pixels` (or `Bad`), at the target's colour and size."""

    def __init__(
        self,
        target: Target,
        arrays: tuple[np.ndarray, np.ndarray] | None,
        image_feature: str,
        label_feature: str,
        test_fraction: float,
    ) -> None:
        self.target, self.arrays = target, arrays
        self.image_feature, self.label_feature = image_feature, label_feature
        self.test_fraction = test_fraction
        self._reshape: dict[int, Any] = {}

    def all(self, items: list[Item]) -> Iterator[Pixels | Bad]:
        files = [item for item in items if item.uri and item.split]
        datas = _read_ahead([item.uri for item in files])
        for item in items:
            if item.row >= 0:
                yield self._array(item)
            elif item.split:
                yield self._file(item, next(datas))
            else:
                yield from self._records(item)

    def _array(self, item: Item) -> Pixels:
        assert self.arrays is not None
        array = self.arrays[0][item.row]
        array = array[..., None] if array.ndim == 2 else array
        return Pixels(self._shaped(array), item.label, item.split, item.name)

    def _file(self, item: Item, data: bytes | Exception) -> Pixels | Bad:
        if isinstance(data, Exception):
            raise DataError(f"{item.uri}: cannot be read ({data})") from data
        decoded = self._decode(item.name, data)
        if isinstance(decoded, Bad):
            return decoded
        return Pixels(decoded, item.label, item.split, item.name)

    def _records(self, item: Item) -> Iterator[Pixels | Bad]:
        """A TFRecord file's records: the image and label features of each, its split by the
        hash of the file's name and the record's index, the first `keep` of each split."""
        try:
            data = storage.read_bytes(item.uri)
        except FileNotFoundError as exc:
            raise DataError(f"{item.uri}: no longer exists") from exc
        parse = tfrecord.parse_example
        taken: Counter[str] = Counter()
        for index, record in enumerate(_records_of(item.uri, data)):
            split = split_of(f"{item.name}:{index}", self.test_fraction)
            if item.keep is not None:
                if taken[split] >= item.keep.get(split, 0):
                    continue
                taken[split] += 1
            where = f"{item.uri} record {index}"
            try:
                features = parse(record)
            except ValueError as exc:
                raise DataError(f"{where}: not a tf.train.Example ({exc})") from exc
            encoded, label = features.get(self.image_feature), features.get(self.label_feature)
            if not isinstance(encoded, bytes) or not isinstance(label, int):
                raise DataError(
                    f"{where}: no {self.image_feature!r} bytes feature and "
                    f"{self.label_feature!r} integer feature (its features: "
                    f"{', '.join(sorted(features)) or 'none'}); set image_feature and "
                    "label_feature to the source's names"
                )
            if label < 0:
                raise DataError(f"{where}: label {label} is out of range (labels count from 0)")
            name = f"{PurePosixPath(item.uri).name} record {index}"
            decoded = self._decode(name, encoded)
            yield decoded if isinstance(decoded, Bad) else Pixels(decoded, label, split, name)

    def _decode(self, name: str, data: bytes) -> np.ndarray | Bad:
        """An image file's bytes as pixels at the target's colour and size, or why not."""
        problem = image_problem(data)
        if problem:
            return Bad(name, problem)
        tf = keras_env.tensorflow()
        try:
            decoded = images.decode(tf, data)
        except tf.errors.InvalidArgumentError as exc:
            first = str(exc.message).strip().splitlines()[0] if exc.message else "invalid"
            return Bad(name, f"cannot be decoded ({first.split('}} ')[-1]})")
        return self._shaped(decoded)

    def _shaped(self, image: Any) -> np.ndarray:
        """`image` (a tensor or array, 1 or 3 channels) at the target's channels and size."""
        size, channels = self.target.size, self.target.channels
        height, width, own = image.shape
        if (channels in (None, own)) and size in (0, height) and size in (0, width):
            return np.asarray(image)
        channels = channels or int(own)
        if channels not in self._reshape:  # traced once: eagerly, ten Python operations an image
            tf = keras_env.tensorflow()

            def reshape(image: Any) -> Any:
                converted = images.to_channels(tf, image, channels)
                return images.resize(tf, converted, size, size) if size else converted

            any_image = tf.TensorSpec([None, None, None], tf.uint8)
            self._reshape[channels] = tf.function(reshape, input_signature=[any_image])
        return np.asarray(self._reshape[channels](image).numpy())


def image_problem(data: bytes) -> str | None:
    """Why `data` is not an image data prep reads, from its header (Pillow's): empty, not an
    image, a format other than JPEG, PNG, BMP and GIF, or over Pillow's decompression-bomb
    limit (``PIL.Image.MAX_IMAGE_PIXELS``)."""
    from PIL import Image, UnidentifiedImageError

    if not data:
        return "0 bytes"
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(io.BytesIO(data)) as image:
                kind, (width, height) = image.format, image.size
    except (Image.DecompressionBombError, Image.DecompressionBombWarning):
        return f"over Pillow's decompression-bomb limit of {Image.MAX_IMAGE_PIXELS:,} pixels"
    except UnidentifiedImageError:
        return "not an image (no JPEG, PNG, BMP or GIF header)"
    except OSError as exc:
        return f"not a readable image ({exc})"
    if kind not in ("JPEG", "MPO", "PNG", "BMP", "GIF"):
        return f"a {kind} image; data prep reads JPEG, PNG, BMP and GIF"
    if width < 1 or height < 1:
        return f"{width}x{height} pixels"
    return None


def _read_ahead(uris: list[str]) -> Iterator[bytes | Exception]:
    """The bytes of each of `uris` in order, up to `READ_AHEAD` being read at once."""

    def read(uri: str) -> bytes | Exception:
        try:
            return storage.read_bytes(uri)
        except Exception as exc:  # reported with the file's name where it is used
            return exc

    with ThreadPoolExecutor(max_workers=READ_AHEAD) as pool:
        queued = iter(uris)
        pending = deque(pool.submit(read, uri) for uri in islice(queued, READ_AHEAD))
        while pending:
            data = pending.popleft().result()
            pending.extend(pool.submit(read, uri) for uri in islice(queued, 1))
            yield data


def _records_of(uri: str, data: bytes) -> Iterator[bytes]:
    try:
        yield from tfrecord.read_records(data)
    except ValueError as exc:
        raise DataError(f"{uri}: not a TFRecord file ({exc})") from exc
