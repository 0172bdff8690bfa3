"""Data prep of a user's own images: an image folder, a .csv index and TFRecord files, each into
the same prepared dataset; their shapes, colours, classes and splits; and every bad input in one
line, naming the file or the row, with nothing written."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from components.common import dataset, storage, tfrecord
from components.common.tests.datasets import image_folder, lfw_faces, read_arrays, save_image
from components.data_prep import prep
from components.data_prep.sources import detect, list_source, split_of


def _encoded(pixels: np.ndarray, kind: str = "PNG") -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(pixels.squeeze()).save(buffer, kind)
    return buffer.getvalue()


def _write_tfrecords(
    folder: Path,
    files: int = 2,
    per_file: int = 10,
    image_key: str = "image/encoded",
    label_key: str = "image/class/label",
    labels: int = 3,
) -> list[tuple[np.ndarray, int]]:
    """TFRecord files written by TensorFlow's own writer: Examples of a PNG image and a label."""
    from components.common import keras_env

    tf = keras_env.tensorflow()
    rng = np.random.default_rng(5)
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for f in range(files):
        with tf.io.TFRecordWriter(str(folder / f"part-{f}.tfrecord")) as writer:
            for k in range(per_file):
                label = (f * per_file + k) % labels
                pixels = rng.integers(0, 256, (12, 12, 3), np.uint8)
                feature = {
                    image_key: tf.train.Feature(
                        bytes_list=tf.train.BytesList(value=[_encoded(pixels)])
                    ),
                    label_key: tf.train.Feature(int64_list=tf.train.Int64List(value=[label])),
                }
                example = tf.train.Example(features=tf.train.Features(feature=feature))
                writer.write(example.SerializeToString())
                written.append((pixels, label))
    return written


def test_a_folder_of_classes_becomes_a_dataset_of_its_images(tmp_path: Path) -> None:
    """Every format Keras reads, class names from the folders sorted, the images' own size and
    colour, each image in exactly one split, its pixels as decoded, and the classes mixed in the
    shard order (not one class after another)."""
    root = tmp_path / "images"
    written = image_folder(
        root, {"zebra": 20, "cat": 20, "dog": 20}, size=(12, 10), suffixes=("png", "bmp", "gif")
    )
    (root / "cat" / "notes.txt").write_text("not an image: ignored, as Keras ignores it")
    (root / ".hidden").mkdir()
    manifest = prep.prepare(str(root), str(tmp_path / "ds"), shard_size=16)
    assert manifest["classes"] == ["cat", "dog", "zebra"]
    assert manifest["image"] == {"height": 12, "width": 10, "channels": 3}
    assert manifest["source"]["format"] == "folder"
    counts = {s: b["count"] for s, b in manifest["splits"].items()}
    assert sum(counts.values()) == 60 and counts["test"] > 0
    seen = {}
    for split in ("train", "test"):
        x, y = read_arrays(str(tmp_path / "ds"), split)
        for pixels, label in zip(x, y, strict=True):
            seen[pixels.tobytes()] = (manifest["classes"][label], split)
    for rel, pixels in written.items():  # lossless formats: the very pixels, once each
        name, split = seen[pixels.tobytes()]
        assert name == rel.split("/")[0] and split == split_of(rel, 0.2)
    _, labels = read_arrays(str(tmp_path / "ds"), "train")
    assert len(set(labels[:10].tolist())) > 1


def test_the_split_of_an_image_does_not_change_when_images_are_added(tmp_path: Path) -> None:
    root = tmp_path / "images"
    image_folder(root, {"a": 30, "b": 30})
    before = {i.name: i.split for i in list_source(str(root)).items}
    image_folder(root / "more", {"a": 10})  # a third folder would be a class: move them in
    for path in (root / "more" / "a").iterdir():
        path.rename(root / "a" / f"new-{path.name}")
    (root / "more" / "a").rmdir()
    (root / "more").rmdir()
    after = {i.name: i.split for i in list_source(str(root)).items}
    assert len(after) == 70 and {k: after[k] for k in before} == before


def test_image_size_resizes_and_color_mode_converts(tmp_path: Path) -> None:
    """Mixed sizes are resized to image_size; grayscale and colour images meet in one colour:
    auto is grayscale only if every image is, and a grayscale image of a colour dataset is its
    gray level in all three channels."""
    root = tmp_path / "images"
    image_folder(root, {"a": 8}, size=(20, 30), channels=1, suffixes=("png", "jpg"))
    image_folder(root, {"b": 8}, size=(40, 40), channels=1, seed=1)
    gray = prep.prepare(str(root), str(tmp_path / "gray"), image_size=16)
    assert gray["image"] == {"height": 16, "width": 16, "channels": 1}
    rgb = prep.prepare(str(root), str(tmp_path / "rgb"), image_size=16, color_mode="rgb")
    assert rgb["image"]["channels"] == 3
    x1, _ = read_arrays(str(tmp_path / "gray"), "train")
    x3, _ = read_arrays(str(tmp_path / "rgb"), "train")
    np.testing.assert_array_equal(x3, np.repeat(x1, 3, axis=3))
    save_image(root / "b" / "colour.png", np.full((40, 40, 3), (250, 10, 10), np.uint8))
    mixed = prep.prepare(str(root), str(tmp_path / "mixed"), image_size=16)
    assert mixed["image"]["channels"] == 3  # auto: one colour image makes a colour dataset
    xm, _ = read_arrays(str(tmp_path / "mixed"), "train")
    assert {tuple(np.unique(img[..., 0] - img[..., 1])) == (0,) for img in xm} == {True, False}
    forced = prep.prepare(
        str(root), str(tmp_path / "forced"), image_size=16, color_mode="grayscale"
    )
    assert forced["image"]["channels"] == 1


def test_an_index_file_with_ml_use_relative_paths_and_gcs(tmp_path: Path, gcs_uri: str) -> None:
    """Rows ``[ML_USE,]URI,LABEL``: ML_USE decides the split where given (validation kept as its
    own split), a path is read relative to the index, and an index on GCS names gs:// images."""
    root = tmp_path / "images"
    written = image_folder(root, {"x": 6, "y": 6})
    rels = sorted(written)
    rows = [f"training,images/{rel},{rel.split('/')[0]}" for rel in rels[:4] + rels[6:10]]
    rows += [f"TEST,images/{rels[4]},x", f"test,images/{rels[10]},y"]
    rows += [f"validation,images/{rels[5]},x", f"images/{rels[11]},y"]
    (tmp_path / "index.csv").write_text("\n".join(rows) + "\n\n")
    manifest = prep.prepare(str(tmp_path / "index.csv"), str(tmp_path / "ds"))
    counts = {s: b["count"] for s, b in manifest["splits"].items()}
    assert counts["test"] >= 2 and counts["validation"] == 1 and sum(counts.values()) == 12
    assert manifest["classes"] == ["x", "y"] and manifest["source"]["format"] == "csv"

    for rel in rels:
        storage.write_bytes(f"{gcs_uri}/imgs/{rel}", (root / rel).read_bytes())
    gcs_rows = [f"gs://{gcs_uri[5:]}/imgs/{rel},{rel.split('/')[0]}" for rel in rels]
    storage.write_text(f"{gcs_uri}/index.csv", "\n".join(gcs_rows))
    on_gcs = prep.prepare(f"{gcs_uri}/index.csv", f"{gcs_uri}/ds", image_size=8)
    assert sum(b["count"] for b in on_gcs["splits"].values()) == 12
    x, _ = read_arrays(f"{gcs_uri}/ds", "train")
    assert x.shape[1:] == (8, 8, 3)


def test_tfrecords_as_a_file_a_folder_or_a_glob_with_their_own_feature_names(
    tmp_path: Path,
) -> None:
    written = _write_tfrecords(tmp_path / "tf", image_key="jpeg", label_key="cls")
    for source in (str(tmp_path / "tf"), str(tmp_path / "tf" / "*.tfrecord")):
        out = tmp_path / f"ds-{len(list(tmp_path.iterdir()))}"
        manifest = prep.prepare(source, str(out), image_feature="jpeg", label_feature="cls")
        assert manifest["source"]["format"] == "tfrecord"
        assert manifest["classes"] == ["0", "1", "2"]
        assert sum(b["count"] for b in manifest["splits"].values()) == 20
        x, y = read_arrays(str(out), "train")
        wanted = {p.tobytes(): label for p, label in written}
        assert all(wanted[img.tobytes()] == label for img, label in zip(x, y, strict=True))
    one = prep.prepare(
        str(tmp_path / "tf" / "part-1.tfrecord"),
        str(tmp_path / "one"),
        image_feature="jpeg",
        label_feature="cls",
        data_limit=6,
    )
    counts = {s: b["count"] for s, b in one["splits"].items()}
    assert counts["train"] == 6 and 1 <= counts["test"] <= 6  # the file's first of each split
    assert detect(str(tmp_path / "tf")) == "tfrecord"


def test_the_same_images_give_the_same_bytes(tmp_path: Path) -> None:
    root = tmp_path / "images"
    image_folder(root, {"a": 10, "b": 10}, suffixes=("jpg",))
    a = prep.prepare(str(root), str(tmp_path / "a"), image_size=8, prep_parallelism=3)
    b = prep.prepare(str(root), str(tmp_path / "b"), image_size=8, prep_parallelism=3)
    assert a == b
    files = sorted(
        p.relative_to(tmp_path / "a") for p in (tmp_path / "a").rglob("*") if p.is_file()
    )
    for rel in files:
        assert (tmp_path / "a" / rel).read_bytes() == (tmp_path / "b" / rel).read_bytes()


def test_a_real_dataset_of_two_classes_at_25x25(tmp_path: Path) -> None:
    """scikit-image's Labeled Faces in the Wild subset, as a user's folder would hold it."""
    manifest = prep.prepare(str(lfw_faces(tmp_path / "lfw")), str(tmp_path / "ds"))
    assert manifest["classes"] == ["face", "nonface"]
    assert manifest["image"] == {"height": 25, "width": 25, "channels": 1}
    assert sum(b["count"] for b in manifest["splits"].values()) == 200


# Every bad input: one line naming the file, the row or the class, and nothing written ------------


def _folder(tmp: Path, classes: dict[str, int], **kw: object) -> Path:
    image_folder(tmp / "src", classes, **kw)  # type: ignore[arg-type]
    return tmp / "src"


def _with(tmp: Path, rel: str, data: bytes) -> Path:
    root = _folder(tmp, {"a": 5, "b": 5})
    (root / rel).write_bytes(data)
    return root


def _truncated(tmp: Path) -> Path:
    pixels = np.random.default_rng(0).integers(0, 256, (32, 32, 3), np.uint8)
    data = _encoded(pixels, "JPEG")
    return _with(tmp, "a/cut.jpg", data[: len(data) // 2])


def _bomb(tmp: Path) -> Path:
    root = _folder(tmp, {"a": 5, "b": 5})
    Image.new("1", (10_000, 10_000)).save(root / "a" / "huge.png")  # 100 M pixels > 89.5 M
    return root


def _index(tmp: Path, rows: list[str]) -> Path:
    _folder(tmp, {"a": 3, "b": 3})
    (tmp / "index.csv").write_text("\n".join(rows) + "\n")
    return tmp / "index.csv"


def _empty_class(tmp: Path) -> Path:
    root = _folder(tmp, {"a": 4, "b": 4})
    (root / "c").mkdir()
    (root / "c" / "readme.txt").write_text("no images here")
    return root


def _tfrecords(tmp: Path, **kw: object) -> Path:
    _write_tfrecords(tmp / "tf", **kw)  # type: ignore[arg-type]
    return tmp / "tf"


def _negative_label(tmp: Path) -> Path:
    folder = tmp / "tf"
    folder.mkdir()
    record = tfrecord.example(
        {"image/encoded": _encoded(np.zeros((4, 4), np.uint8)), "image/class/label": -1}
    )
    (folder / "x.tfrecord").write_bytes(tfrecord.frame(record))
    return folder


BAD = {
    "empty folder": (lambda tmp: (tmp / "e").mkdir() or tmp / "e", {}, "no class subfolders"),
    "one class": (lambda tmp: _folder(tmp, {"only": 5}), {}, "only the class 'only'"),
    "class without images": (_empty_class, {}, "src/c: a class folder without images"),
    "truncated": (_truncated, {}, "a/cut.jpg (cannot be decoded"),
    "text named .png": (lambda tmp: _with(tmp, "b/text.png", b"hello"), {}, "b/text.png (not an "),
    "0 bytes": (lambda tmp: _with(tmp, "a/empty.png", b""), {}, "a/empty.png (0 bytes)"),
    "bomb": (_bomb, {"image_size": 8}, "a/huge.png (over Pillow's decompression-bomb limit"),
    "mixed sizes": (
        lambda tmp: _folder(tmp, {"a": 3}) and _folder(tmp, {"b": 3}, size=(9, 9)),
        {},
        "images have different sizes",
    ),
    "missing file": (
        lambda tmp: _index(tmp, ["src/a/0000.png,a", "src/a/nope.png,b"]),
        {},
        "index.csv row 2: ",
    ),
    "duplicate": (
        lambda tmp: _index(tmp, ["src/a/0000.png,a", "src/a/0000.png,b"]),
        {},
        "index.csv row 2: src/a/0000.png is listed again (first in row 1)",
    ),
    "label without training images": (
        lambda tmp: _index(tmp, ["training,src/a/0000.png,a", "test,src/b/0000.png,b"]),
        {},
        "class 'b' has no training images",
    ),
    "bad ML_USE": (
        lambda tmp: _index(tmp, ["later,src/a/0000.png,a"]),
        {},
        "index.csv row 1: ML_USE 'later'",
    ),
    "header row": (
        lambda tmp: _index(tmp, ["uri,label", "src/a/0000.png,a"]),
        {},
        "index.csv row 1: 'uri' is not an image file",
    ),
    "tfrecord features": (
        lambda tmp: _tfrecords(tmp, image_key="img"),
        {},
        "part-0.tfrecord record 0: no 'image/encoded' bytes feature",
    ),
    "tfrecord label": (_negative_label, {}, "x.tfrecord record 0: label -1 is out of range"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_input_fails_in_one_line_naming_it_and_writes_nothing(
    tmp_path: Path, case: str
) -> None:
    make, options, message = BAD[case]
    source = make(tmp_path)
    out = tmp_path / "out"
    with pytest.raises(dataset.DataError) as info:
        prep.prepare(str(source), str(out), **options)
    assert message in str(info.value) and "\n" not in str(info.value)
    assert not out.exists() and not list(tmp_path.glob(".out.*"))


def test_bad_images_are_named_and_counted_and_can_be_skipped(tmp_path: Path) -> None:
    root = _folder(tmp_path, {"a": 6, "b": 6})
    for k in range(5):
        (root / "a" / f"bad-{k}.png").write_bytes(b"")
    with pytest.raises(dataset.DataError) as info:
        prep.prepare(str(root), str(tmp_path / "out"))
    assert str(info.value).startswith("5 image(s) cannot be used: a/bad-")
    assert str(info.value).count("(0 bytes)") == 3 and "and 2 more" in str(info.value)
    manifest = prep.prepare(str(root), str(tmp_path / "out"), skip_bad_images=True)
    assert manifest["skipped"]["count"] == 5 and len(manifest["skipped"]["examples"]) == 3
    assert sum(b["count"] for b in manifest["splits"].values()) == 12


def test_a_gcs_folder_source(gcs_uri: str, tmp_path: Path) -> None:
    written = image_folder(tmp_path / "images", {"a": 5, "b": 5})
    for rel in written:
        storage.write_bytes(f"{gcs_uri}/photos/{rel}", (tmp_path / "images" / rel).read_bytes())
    assert detect(f"{gcs_uri}/photos") == "folder"
    manifest = prep.prepare(f"{gcs_uri}/photos", str(tmp_path / "ds"))
    assert manifest["classes"] == ["a", "b"]
    assert sum(b["count"] for b in manifest["splits"].values()) == 10
