"""Where MNIST comes from: the bundled 5,000-digit subset, or an ``mnist.npz`` by URL or path."""

from __future__ import annotations

import io
import urllib.error
import urllib.request
from dataclasses import dataclass
from importlib import resources
from typing import Any

import numpy as np

from components.common import storage
from components.common.dataset import DataError, sha256_bytes
from components.common.defaults import BUNDLED_SOURCE, MNIST_SHA256, SPLIT_SEED, TEST_FRACTION

# The bundled digits: uint8 `images` (5000, 28, 28) and `labels` (5000,), sorted by label.
BUNDLED_FILE = "data/mnist_5k.npz"


@dataclass
class SourceData:
    """A source's arrays, not yet validated, and where they came from."""

    splits: dict[str, tuple[Any, Any]]
    description: dict[str, Any]


def load_bundled(test_fraction: float = TEST_FRACTION, seed: int = SPLIT_SEED) -> SourceData:
    """The 5,000 real MNIST digits bundled with this package (data/README.md); the file is
    sorted by label, so they are split after a seeded shuffle."""
    with (
        (resources.files("components.data_prep") / BUNDLED_FILE).open("rb") as f,
        np.load(f) as bundle,
    ):
        images, labels = bundle["images"], bundle["labels"]
    order = np.random.default_rng(seed).permutation(len(labels))
    images, labels = images[order], labels[order]
    n_test = int(round(len(labels) * test_fraction))
    return SourceData(
        splits={
            "train": (images[n_test:], labels[n_test:]),
            "test": (images[:n_test], labels[:n_test]),
        },
        description={
            "uri": BUNDLED_SOURCE,
            "sha256": sha256_bytes(
                images.astype(np.uint8).tobytes() + labels.astype(np.uint8).tobytes()
            ),
            "split_seed": seed,
            "test_fraction": test_fraction,
        },
    )


def fetch(uri: str, timeout_s: float = 60.0) -> bytes:
    """The bytes at an http(s) URL, a ``gs://`` URI or a local path; DataError naming it."""
    if uri.startswith(("http://", "https://")):
        try:
            with urllib.request.urlopen(uri, timeout=timeout_s) as response:  # noqa: S310
                return bytes(response.read())
        except (urllib.error.URLError, OSError) as exc:
            raise DataError(f"{uri}: unreachable ({exc})") from exc
    try:
        return storage.read_bytes(uri)
    except FileNotFoundError as exc:
        raise DataError(f"{uri}: not found") from exc
    except Exception as exc:
        raise DataError(f"{uri}: unreadable ({exc})") from exc


def load_mnist_npz(uri: str, expected_sha256: str | None = MNIST_SHA256) -> SourceData:
    """An ``mnist.npz`` (x_train, y_train, x_test, y_test), its sha256 checked unless None."""
    data = fetch(uri)
    digest = sha256_bytes(data)
    if expected_sha256 is not None and digest != expected_sha256.lower():
        raise DataError(
            f"{uri}: sha256 mismatch: got {digest}, expected {expected_sha256} "
            "(corrupt or not the canonical mnist.npz; pass its sha256 as --data-sha256, or "
            "--data-sha256 none not to check it)"
        )
    try:
        with np.load(io.BytesIO(data), allow_pickle=False) as npz:
            missing = {"x_train", "y_train", "x_test", "y_test"} - set(npz.files)
            if missing:
                raise DataError(f"{uri}: missing arrays {sorted(missing)} (found {npz.files})")
            splits = {
                "train": (npz["x_train"], npz["y_train"]),
                "test": (npz["x_test"], npz["y_test"]),
            }
    except DataError:
        raise
    except Exception as exc:
        raise DataError(f"{uri}: not a readable .npz file ({exc})") from exc
    return SourceData(splits=splits, description={"uri": uri, "sha256": digest})
