"""TFRecord files of ``tf.train.Example`` written without importing TensorFlow. Runs in the data
prep step's pod (writing the shards) and wherever a shard on GCS is streamed (each rank, the
evaluate step's pod).
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Callable, Iterator
from functools import lru_cache
from typing import Any, BinaryIO

import google_crc32c

# Data prep writes the prepared dataset's shards in TensorFlow's own formats, which ``tf.data``
# reads on every rank. Importing TensorFlow costs a data-prep task 3.5 to 5 seconds on this
# project's 2-core machine, where converting the 4,000 bundled digits takes a fraction of a second,
# and the digits need no decoding. So the writer here uses the two formats' public definitions with
# their own libraries: the ``tf.train.Example`` messages
# (``tensorflow/core/example/{example,feature}.proto``) declared to protobuf, and TFRecord's framing
# (a little-endian length and payload, each with its masked CRC32C) with ``google-crc32c``, which
# google-cloud-storage already brings. The bytes equal ``tf.io.TFRecordWriter``'s for the same
# deterministic ``SerializeToString`` of the same Example (components/common/tests/test_tfrecord.py
# compares them); data prep imports TensorFlow only to decode or resize images.
_MASK_DELTA = 0xA282EAD8


def masked_crc32c(data: bytes) -> int:
    """TFRecord's checksum: CRC32C rotated right by 15 bits plus a constant, mod 2**32."""
    crc = google_crc32c.value(data)
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF


def frame(record: bytes) -> bytes:
    """One record as TFRecord stores it: length, its checksum, the record, its checksum."""
    length = struct.pack("<Q", len(record))
    return b"".join(
        (
            length,
            struct.pack("<I", masked_crc32c(length)),
            record,
            struct.pack("<I", masked_crc32c(record)),
        )
    )


@lru_cache(maxsize=1)
def _example_class() -> Any:
    """``tensorflow.Example`` as a protobuf message class, from the messages' public schema,
    in a pool of its own (a process that imports TensorFlow too keeps TensorFlow's)."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    field = descriptor_pb2.FieldDescriptorProto
    repeated, optional = field.LABEL_REPEATED, field.LABEL_OPTIONAL

    def message(name: str, *fields: tuple[str, int, int, int, str]) -> Any:
        made = descriptor_pb2.DescriptorProto(name=name)
        for field_name, number, label, kind, type_name in fields:
            added = made.field.add(name=field_name, number=number, label=label, type=kind)
            if type_name:
                added.type_name = type_name
        return made

    file = descriptor_pb2.FileDescriptorProto(
        name="kfp_horovod/tensorflow_example.proto", package="tensorflow", syntax="proto3"
    )
    file.message_type.extend(
        [
            message("BytesList", ("value", 1, repeated, field.TYPE_BYTES, "")),
            message("FloatList", ("value", 1, repeated, field.TYPE_FLOAT, "")),
            message("Int64List", ("value", 1, repeated, field.TYPE_INT64, "")),
            message(
                "Feature",
                ("bytes_list", 1, optional, field.TYPE_MESSAGE, ".tensorflow.BytesList"),
                ("float_list", 2, optional, field.TYPE_MESSAGE, ".tensorflow.FloatList"),
                ("int64_list", 3, optional, field.TYPE_MESSAGE, ".tensorflow.Int64List"),
            ),
            message("Features"),
            message(
                "Example", ("features", 1, optional, field.TYPE_MESSAGE, ".tensorflow.Features")
            ),
        ]
    )
    feature = file.message_type[3]
    feature.oneof_decl.add(name="kind")
    for one in feature.field:
        one.oneof_index = 0
    features = file.message_type[4]
    entry = features.nested_type.add(name="FeatureEntry")
    entry.options.map_entry = True
    entry.field.add(name="key", number=1, label=optional, type=field.TYPE_STRING)
    entry.field.add(
        name="value",
        number=2,
        label=optional,
        type=field.TYPE_MESSAGE,
        type_name=".tensorflow.Feature",
    )
    features.field.add(
        name="feature",
        number=1,
        label=repeated,
        type=field.TYPE_MESSAGE,
        type_name=".tensorflow.Features.FeatureEntry",
    )
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("tensorflow.Example"))


def example(features: dict[str, bytes | int]) -> bytes:
    """A serialized ``tf.train.Example`` of `features`: bytes as a one-value ``bytes_list``,
    an int as a one-value ``int64_list``; deterministic (map entries in key order)."""
    made = _example_class()()
    for key, value in features.items():
        feature = made.features.feature[key]
        if isinstance(value, bytes):
            feature.bytes_list.value.append(value)
        else:
            feature.int64_list.value.append(int(value))
    return bytes(made.SerializeToString(deterministic=True))


def _frames(data: bytes) -> Iterator[tuple[int, int]]:
    """(offset, length) of each record of a TFRecord file's bytes, each length's checksum
    checked; ValueError where the bytes are not TFRecord framing."""
    offset = 0
    while offset < len(data):
        header = data[offset : offset + 12]
        if len(header) < 12:
            raise ValueError(f"truncated record header at byte {offset}")
        (length,) = struct.unpack("<Q", header[:8])
        if struct.unpack("<I", header[8:])[0] != masked_crc32c(header[:8]):
            raise ValueError(f"bad length checksum at byte {offset}")
        if offset + 16 + length > len(data):
            raise ValueError(f"truncated record at byte {offset}")
        yield offset + 12, length
        offset += 16 + length


def read_framed(header: bytes, read: Callable[[int], bytes]) -> bytes:
    """The record whose 12-byte `header` was just read, the rest read with `read(n)`; each
    checksum checked (ValueError where they fail or the stream ends early)."""
    if len(header) < 12:
        raise ValueError("truncated record header")
    (length,) = struct.unpack("<Q", header[:8])
    if struct.unpack("<I", header[8:])[0] != masked_crc32c(header[:8]):
        raise ValueError("bad length checksum (not a TFRecord file, or corrupt)")
    body = read(length + 4)
    if len(body) < length + 4:
        raise ValueError("truncated record")
    record = body[:length]
    if struct.unpack("<I", body[length:])[0] != masked_crc32c(record):
        raise ValueError("fails its checksum (corrupt)")
    return record


def count_records(data: bytes) -> int:
    """The records in a TFRecord file's bytes, from its framing alone."""
    return sum(1 for _ in _frames(data))


def read_records(data: bytes) -> Iterator[bytes]:
    """The records of a TFRecord file's bytes, each checked against its checksum."""
    for start, length in _frames(data):
        record = data[start : start + length]
        (stored,) = struct.unpack("<I", data[start + length : start + length + 4])
        if stored != masked_crc32c(record):
            raise ValueError(f"record at byte {start - 12} fails its checksum (corrupt)")
        yield record


def parse_example(record: bytes) -> dict[str, bytes | int | float]:
    """A serialized ``tf.train.Example``'s features, each by its first value (ValueError if
    the bytes are not an Example)."""
    from google.protobuf.message import DecodeError

    try:
        parsed = _example_class().FromString(record)
    except DecodeError as exc:
        raise ValueError(str(exc) or "undecodable") from exc
    features: dict[str, bytes | int | float] = {}
    for key, feature in parsed.features.feature.items():
        kind = feature.WhichOneof("kind")
        values = getattr(feature, kind).value if kind else []
        if values:
            features[key] = values[0]
    return features


class RecordWriter:
    """Writes framed records to a binary file and keeps their count and the file's sha256."""

    def __init__(self, file: BinaryIO) -> None:
        self.file, self.count, self._sha256 = file, 0, hashlib.sha256()

    def write(self, record: bytes) -> None:
        framed = frame(record)
        self.file.write(framed)
        self._sha256.update(framed)
        self.count += 1

    @property
    def sha256(self) -> str:
        return self._sha256.hexdigest()
