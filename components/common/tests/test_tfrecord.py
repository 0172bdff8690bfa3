"""The TFRecord writer without TensorFlow: its files are byte for byte TensorFlow's own, and its
reader checks what TensorFlow checks."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from components.common import keras_env, tfrecord


def _features(k: int) -> dict[str, bytes | int]:
    pixels = np.random.default_rng(k).integers(0, 256, 300, np.uint8).tobytes()
    return {"image/encoded": pixels, "image/class/label": k * 7 - 3}


def test_the_files_equal_tensorflows_own(tmp_path: Path) -> None:
    tf = keras_env.tensorflow()
    ours = tmp_path / "ours.tfrecord"
    with ours.open("wb") as fh:
        writer = tfrecord.RecordWriter(fh)
        for k in range(5):
            writer.write(tfrecord.example(_features(k)))
    with tf.io.TFRecordWriter(str(tmp_path / "tf.tfrecord")) as theirs:
        for k in range(5):
            f = _features(k)
            feature = {
                "image/encoded": tf.train.Feature(
                    bytes_list=tf.train.BytesList(value=[f["image/encoded"]])
                ),
                "image/class/label": tf.train.Feature(
                    int64_list=tf.train.Int64List(value=[f["image/class/label"]])
                ),
            }
            example = tf.train.Example(features=tf.train.Features(feature=feature))
            theirs.write(example.SerializeToString(deterministic=True))
    data = ours.read_bytes()
    assert data == (tmp_path / "tf.tfrecord").read_bytes()
    assert writer.count == 5 and tfrecord.count_records(data) == 5
    parsed = [tfrecord.parse_example(r) for r in tfrecord.read_records(data)]
    assert parsed == [_features(k) for k in range(5)]
    read = list(tf.data.TFRecordDataset(str(ours)).as_numpy_iterator())
    assert [tfrecord.parse_example(r) for r in read] == parsed


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda d: d[:-3], "truncated record"),
        (lambda d: d[:5], "truncated record header"),
        (lambda d: d[:20] + bytes([d[20] ^ 1]) + d[21:], "fails its checksum"),
        (lambda d: b"\x00" * 8 + d[8:], "bad length checksum"),
    ],
)
def test_damaged_files_are_refused(damage, message: str) -> None:
    data = b"".join(tfrecord.frame(tfrecord.example(_features(k))) for k in range(2))
    with pytest.raises(ValueError, match=message):
        list(tfrecord.read_records(damage(data)))


def test_bytes_that_are_no_example_are_refused() -> None:
    with pytest.raises(ValueError):
        tfrecord.parse_example(b"\xff\xff\xff")
