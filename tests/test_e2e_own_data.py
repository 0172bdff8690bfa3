"""A user's own images end to end, as the README shows them: scikit-image's Labeled Faces in
the Wild subset (200 faces and non-faces, 25x25 grayscale: another shape and class count than
MNIST's), as an image folder, as a .csv index and as TFRecord files. Each trains through
``python -m pipeline run-local`` to a registered model, which ``make serve``'s server answers
about an image file with its class's name."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import numpy as np
import pytest

from components.common import dataset, keras_env
from components.common.tests.datasets import lfw_faces, read_arrays
from components.serve.tests.test_serve import post, running
from tests.conftest import run_local_pipeline

pytestmark = pytest.mark.e2e
KINDS = ("folder", "csv", "tfrecord")


@pytest.fixture(scope="module")
def faces(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The same 200 faces and non-faces as a folder, an index of it, and TFRecord files of it
    written by TensorFlow's own writer (PNG bytes and a label, TF's feature names)."""
    root = tmp_path_factory.mktemp("faces")
    folder = lfw_faces(root / "folder")
    files = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*.png"))
    rows = [f"folder/{rel},{rel.split('/')[0]}" for rel in files]
    (root / "faces.csv").write_text("\n".join(rows) + "\n")
    tf = keras_env.tensorflow()
    (root / "tfrecords").mkdir()
    for part in range(2):
        with tf.io.TFRecordWriter(str(root / "tfrecords" / f"faces-{part}.tfrecord")) as writer:
            for rel in files[part::2]:
                label = 0 if rel.startswith("face/") else 1
                feature = {
                    "image/encoded": tf.train.Feature(
                        bytes_list=tf.train.BytesList(value=[(folder / rel).read_bytes()])
                    ),
                    "image/class/label": tf.train.Feature(
                        int64_list=tf.train.Int64List(value=[label])
                    ),
                }
                example = tf.train.Example(features=tf.train.Features(feature=feature))
                writer.write(example.SerializeToString())
    sources = {"folder": folder, "csv": root / "faces.csv", "tfrecord": root / "tfrecords"}
    return {kind: str(path) for kind, path in sources.items()}


@pytest.mark.parametrize("kind", KINDS)
def test_own_images_train_to_a_registered_served_model(
    kind: str, faces: dict[str, str], tmp_path: Path
) -> None:
    name = f"faces-{kind}"
    options = ["--data-source", faces[kind], "--model-name", name, "--epochs", "12"]
    run = run_local_pipeline(tmp_path, *options, "--min-accuracy", "0.6")
    outputs = run.outputs()
    manifest = dataset.read_manifest(outputs["dataset"])
    classes = ["face", "nonface"] if kind != "tfrecord" else ["0", "1"]
    assert list(manifest.classes) == classes and manifest.image.shape == (25, 25, 1)
    assert manifest.count("train") + manifest.count("test") == 200
    assert manifest.raw["source"]["format"] == kind
    accuracy = float(outputs["metrics"].split()[1].rstrip(","))
    assert accuracy >= 0.6, outputs["metrics"]  # well above chance (0.5)
    assert outputs["decision"].startswith("registered as version 1; promoted")
    report = Path(outputs["evaluation_report"]).read_text()
    assert all(f"\n| {c} | " in report for c in classes)
    entry = json.loads((Path(outputs["registry_entry"]) / "kfp_horovod_metadata.json").read_text())
    assert entry["dataset"]["classes"] == classes and entry["dataset"]["image"] == [25, 25, 1]

    images, labels = read_arrays(outputs["dataset"], "test")
    files = sorted(Path(faces["folder"]).rglob("*.png"))[::50]  # two faces, two non-faces
    request = {
        "signature_name": "serving_bytes",
        "instances": [{"b64": base64.b64encode(f.read_bytes()).decode()} for f in files],
    }
    with running(str(tmp_path / "registry"), model=name) as (banner, url):
        assert banner.startswith(f"serving {name} version 1 (production)")
        status, answer = post(url, request)
        assert status == 200, answer
        pixels = [np.asarray(images[0])[..., 0].tolist()]  # a test image as pixels, too
        assert post(url, {"instances": pixels})[0] == 200
    predicted = answer["predictions"]
    assert [sorted(p) for p in predicted] == [["class_name", "probabilities"]] * 4
    for p in predicted:
        assert p["class_name"] == classes[int(np.argmax(p["probabilities"]))]
    assert len(labels) == manifest.count("test")
