"""Test data: image folders of real image files (written with Pillow), a real dataset of another
shape and class count than MNIST (scikit-image's ``lfw_subset``), and prepared datasets read back
whole through the product's own reader (`components.common.shard_files.read_split_arrays`)."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import numpy as np

from components.common import dataset, keras_env
from components.common.shard_files import read_split_arrays

FORMATS = {"png": "PNG", "jpg": "JPEG", "jpeg": "JPEG", "bmp": "BMP", "gif": "GIF"}


def save_image(path: Path, pixels: np.ndarray) -> Path:
    """`pixels` (height x width, or x 1 or x 3) as an image file, its format from the suffix."""
    from PIL import Image

    path.parent.mkdir(parents=True, exist_ok=True)
    array = pixels[..., 0] if pixels.ndim == 3 and pixels.shape[2] == 1 else pixels
    Image.fromarray(np.asarray(array, np.uint8)).save(path, FORMATS[path.suffix[1:].lower()])
    return path


def image_folder(
    root: Path,
    classes: dict[str, int],
    size: tuple[int, int] = (16, 16),
    channels: int = 3,
    suffixes: Iterable[str] = ("png",),
    seed: int = 0,
) -> dict[str, np.ndarray]:
    """Keras's layout under `root`: ``<class>/<k>.<suffix>`` for `classes`' counts, each image
    a noise pattern around a level of its class's own (learnable), the suffixes taken in turn.
    Returns each file's pixels by its path below `root`."""
    rng = np.random.default_rng(seed)
    kinds = list(suffixes)
    written = {}
    for index, (name, count) in enumerate(sorted(classes.items())):
        level = 40 + 170 * index / max(1, len(classes) - 1)
        for k in range(count):
            noise = rng.normal(0, 20, (*size, channels))
            pixels = np.clip(level + noise, 0, 255).astype(np.uint8)
            rel = f"{name}/{k:04d}.{kinds[k % len(kinds)]}"
            save_image(root / rel, pixels)
            written[rel] = pixels
    return written


def lfw_faces(root: Path, suffix: str = "png") -> Path:
    """scikit-image's ``lfw_subset`` (Labeled Faces in the Wild: 100 faces, then 100 non-faces,
    25x25 grayscale) as an image folder of two classes, ``face`` and ``nonface``."""
    from skimage import data

    images = data.lfw_subset()
    for k, image in enumerate(images):
        label = "face" if k < 100 else "nonface"
        save_image(root / label / f"{k:03d}.{suffix}", np.round(image * 255).astype(np.uint8))
    return root


def read_arrays(uri: str, split: str) -> tuple[np.ndarray, np.ndarray]:
    """Every image (uint8, n x height x width x channels) and label of `split` of the dataset at
    `uri`, in the manifest's order."""
    return read_split_arrays(keras_env.tensorflow(), dataset.read_manifest(uri), split)
