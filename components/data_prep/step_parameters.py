"""The data-prep steps' parameters, declared once (`components.common.declare`), and which of the
three steps (list, prepare a slice, publish) takes each. Imported by the pipeline's CLI and the
data prep steps' pods.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from components.common import defaults
from components.common.declare import Declared, Validated, nonempty_problem, param
from components.common.defaults import BUNDLED_SOURCE
from components.common.images import COLOR_MODES

# What a data source is (`components.data_prep.sources`): `auto` tells it from the source.
DATA_FORMATS = ("auto", "bundled", "npz", "folder", "csv", "tfrecord")
_SHA256 = re.compile(r"^[0-9a-fA-F]{64}$")
_SOURCE_FORMS = "'bundled', a gs:// or http(s) URL, or an absolute path"


def data_source_problem(source: str) -> str | None:
    if source in ("bundled", BUNDLED_SOURCE):
        return None
    if not source:
        return f"data_source must be {_SOURCE_FORMS}: the data source is empty"
    scheme, sep, _ = source.partition("://")
    if sep and scheme not in ("http", "https", "gs"):
        return f"data_source must be {_SOURCE_FORMS}: unsupported scheme {scheme!r} in {source!r}"
    if not sep and not source.startswith("/"):
        return f"data_source must be {_SOURCE_FORMS}; got {source!r}"
    return None


def data_sha256_problem(sha256: str) -> str | None:
    if sha256.lower() == "none" or _SHA256.match(sha256):
        return None
    return f"data_sha256 {sha256!r} is not 64 hex digits (or 'none')"


@dataclass(frozen=True)
class PrepStep(Validated):
    """Where the images come from, how they are read, shaped, split and cut into shards."""

    what = "data prep parameters"

    data_source: str = param(
        "bundled",
        "bundled (5,000 real MNIST digits, offline), or a local path or gs:// URI of an image "
        "folder (one subfolder per class), a .csv index ([ML_USE,]URI,LABEL rows), TFRecord "
        "files (a file, a folder or a glob) or an mnist.npz (also by http(s) URL)",
        check=data_source_problem,
    )
    data_format: str = param(
        "auto",
        "what data_source is: auto (told from the source), bundled, npz, folder, csv or tfrecord",
        choices=DATA_FORMATS,
    )
    data_sha256: str = param(
        defaults.MNIST_SHA256,
        "an npz source's sha256 ('none': not checked); the default is the canonical mnist.npz's",
        check=data_sha256_problem,
    )
    data_limit: int = param(0, "keep only the first N images of each split (0: all)", minimum=0)
    image_size: int = param(
        0,
        "pixels of the images' square side after resizing (0: the source's own size, when every "
        "image has the same one)",
        minimum=0,
        maximum=4096,
    )
    color_mode: str = param(
        "auto",
        "grayscale (1 channel), rgb (3) or auto (grayscale only if every image is)",
        choices=COLOR_MODES,
    )
    test_fraction: float = param(
        defaults.TEST_FRACTION,
        "the share of images held out for evaluation, chosen by a hash of each image's path "
        "(a .csv's ML_USE column and an npz's own split take precedence)",
        minimum=0,
        maximum=0.9,
    )
    skip_bad_images: bool = param(
        False,
        "skip images that cannot be decoded (counted in the manifest and the report) instead of "
        "failing",
    )
    image_feature: str = param(
        defaults.TFRECORD_IMAGE_FEATURE,
        "a TFRecord source's feature holding the encoded image",
        check=nonempty_problem,
    )
    label_feature: str = param(
        defaults.TFRECORD_LABEL_FEATURE,
        "a TFRecord source's feature holding the class index (an integer from 0)",
        check=nonempty_problem,
    )
    shard_size: int = param(defaults.SHARD_SIZE, "images per TFRecord shard file", minimum=1)
    prep_parallelism: int = param(
        defaults.PREP_PARALLELISM,
        "data-prep tasks that convert the images side by side (KFP ParallelFor), each a slice "
        "of the source",
        minimum=1,
        maximum=256,
    )


_BY_NAME = {p.name: p for p in PrepStep.parameters()}


def _taking(*names: str) -> list[Declared]:
    return [_BY_NAME[name] for name in names]


# The listing step reads the source's names and labels (and an npz's arrays), the slice steps
# read and convert the images, the publish step checks what they wrote and writes the manifest.
LIST_PARAMETERS = _taking(
    "data_source",
    "data_format",
    "data_sha256",
    "data_limit",
    "test_fraction",
    "prep_parallelism",
)
SLICE_PARAMETERS = _taking(
    "image_size", "color_mode", "skip_bad_images", "image_feature", "label_feature", "shard_size"
)
PUBLISH_PARAMETERS = _taking("image_size", "color_mode", "skip_bad_images")
