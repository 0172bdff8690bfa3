"""A dataset's shard files, read by ``tf.data``: whole splits in order (`read_split`, in the
evaluate step's pod) or pieces of files (`piece_records`, in each rank for its block).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from components.common import storage, tfrecord
from components.common.dataset import (
    IMAGE_FEATURE,
    LABEL_FEATURE,
    DataError,
    ImageSpec,
    Manifest,
    decode_records,
)

_CHUNK = 1 << 20
# Records a GCS shard's stream hands ``tf.data`` at once.
RECORDS_PER_YIELD = 256


def file_sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(_CHUNK), b""):
            digest.update(block)
    return digest.hexdigest()


class ShardCheck:
    """Each shard found before it is read: a local one with its sha256 (once per process), a
    GCS one by its listing (its bytes are checked as they stream)."""

    def __init__(self) -> None:
        self._checked: set[str] = set()

    def check(self, uri: str, sha256: str) -> None:
        """DataError naming the shard unless it is there (locally: with its sha256)."""
        if uri in self._checked:
            return
        if storage.is_gcs(uri):
            if not storage.exists(uri):
                raise DataError(f"{uri}: missing (the manifest lists it)")
        else:
            try:
                actual = file_sha256(uri)
            except FileNotFoundError as exc:
                raise DataError(f"{uri}: missing (the manifest lists it)") from exc
            if actual != sha256:
                raise DataError(_corrupt(uri, actual, sha256))
        self._checked.add(uri)


def first_record_problem(uri: str, sha256: str, image: ImageSpec, classes: int) -> str | None:
    """Why the shard at `uri` does not hold what the manifest says, from its first record: its
    pixels not of the manifest's shape, or its label not one of the classes; None if it does."""
    first = next(stream_records(uri, sha256, 0, 1))[0]
    features = tfrecord.parse_example(first)
    pixels, label = features.get(IMAGE_FEATURE), features.get(LABEL_FEATURE)
    sizes = {image.pixels, image.height * image.width}  # a 3-channel dataset's gray records
    if not isinstance(pixels, bytes) or len(pixels) not in sizes:
        got = len(pixels) if isinstance(pixels, bytes) else "no"
        return (
            f"{uri}: record 0 holds {got} bytes of pixels, not a {image.describe()} image as "
            "the manifest says (the manifest and its shards disagree)"
        )
    if not isinstance(label, int) or not 0 <= label < classes:
        return f"{uri}: record 0's label {label!r} is not one of the manifest's {classes} classes"
    return None


# A local shard is read by ``tf.data.TFRecordDataset``, once its sha256 is checked (`ShardCheck`).
# TensorFlow's own ``gs://`` filesystem cannot be pointed at a GCS emulator (it hard-codes Google's
# endpoint), so a shard on GCS is streamed through the project's storage layer
# (`components.common.storage.open_read`: the same client, retries and emulator as every other GCS
# access), its records cut from the stream with their checksums checked
# (`components.common.tfrecord`), and the whole file's sha256 checked when it is read to its end.
# Nothing is staged on disk, and a reader holds a chunk of the stream per open shard, not the shard.
def stream_records(uri: str, sha256: str, skip: int = 0, take: int = -1) -> Iterator[np.ndarray]:
    """Records ``[skip, skip + take)`` (``take`` -1: to the end) of the TFRecord file at `uri`,
    in arrays of up to `RECORDS_PER_YIELD`, read as a stream; DataError for a record that fails
    its checksum, or a file read to its end whose sha256 is not `sha256`."""
    digest, index, chunk = hashlib.sha256(), 0, []
    with storage.open_read(uri) as stream:

        def read(n: int) -> bytes:
            data = stream.read(n)
            digest.update(data)
            return bytes(data)

        while take < 0 or index < skip + take:
            header = read(12)
            if not header:
                break
            try:
                record = tfrecord.read_framed(header, read)
            except ValueError as exc:
                raise DataError(f"{uri}: record {index}: {exc}") from exc
            if index >= skip:
                chunk.append(record)
                if len(chunk) == RECORDS_PER_YIELD:
                    yield np.array(chunk, dtype=object)
                    chunk = []
            index += 1
        else:
            index = -1  # stopped before the end: the file's sha256 is not known
        if chunk:
            yield np.array(chunk, dtype=object)
        if index >= 0 and digest.hexdigest() != sha256:
            raise DataError(_corrupt(uri, digest.hexdigest(), sha256))


def piece_records(tf: Any, pieces: list[tuple[str, str, int, int]]) -> Callable[[Any], Any]:
    """A function from a piece's index to a ``tf.data`` dataset of its serialized records,
    `pieces` being ``(uri, sha256, skip, take)`` (local ones checked by `ShardCheck` first)."""
    if not any(storage.is_gcs(uri) for uri, *_ in pieces):
        paths = tf.constant([uri for uri, *_ in pieces])
        skips = tf.constant([skip for _, _, skip, _ in pieces], tf.int64)
        takes = tf.constant([take for *_, take in pieces], tf.int64)
        return lambda i: tf.data.TFRecordDataset(paths[i]).skip(skips[i]).take(takes[i])

    def generate(index: Any) -> Iterator[np.ndarray]:
        yield from stream_records(*pieces[int(index)])

    def streamed(i: Any) -> Any:
        signature = tf.TensorSpec([None], tf.string)
        return tf.data.Dataset.from_generator(
            generate, args=(i,), output_signature=signature
        ).unbatch()

    return streamed


def read_split(tf: Any, manifest: Manifest, split: str, batch_size: int) -> Any:
    """A ``tf.data`` pipeline of `split`'s images and labels in the manifest's order, in batches
    of `batch_size`, decoded (`dataset.decode_records`); every shard checked first."""
    shards = manifest.shards(split)
    check = ShardCheck()
    for shard in shards:
        check.check(manifest.uri(shard), shard.sha256)
    pieces = [(manifest.uri(s), s.sha256, 0, s.count) for s in shards]
    return (
        tf.data.Dataset.range(len(shards))
        .flat_map(piece_records(tf, pieces))
        .batch(batch_size)
        .map(lambda serialized: decode_records(tf, serialized, manifest.image))
        .prefetch(2)
    )


def read_split_arrays(tf: Any, manifest: Manifest, split: str) -> tuple[np.ndarray, np.ndarray]:
    """The whole of `split`, images and labels in the manifest's order, as arrays: for small
    datasets only (the benchmarks' in-memory references, the tests)."""
    images, labels = [], []
    for x, y in read_split(tf, manifest, split, 1024):
        images.append(x.numpy())
        labels.append(y.numpy())
    return np.concatenate(images), np.concatenate(labels)


def _corrupt(uri: str, actual: str, expected: str) -> str:
    return f"{uri}: corrupt (sha256 {actual[:12]}…, the manifest says {expected[:12]}…)"
