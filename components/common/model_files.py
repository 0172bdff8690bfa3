"""A SavedModel: fetching it, its layout, its digest, and its ``serving_default`` signature. Runs
in rank 0 (the digest of what it exported) and in the evaluate and register steps' pods, which
check a model against that digest, so the model they score or publish is the one that was
trained. Only `load_serving` imports TensorFlow: the register image has none.
"""

from __future__ import annotations

import re
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from components.common import storage
from components.common.failure import InputError

SAVED_MODEL_PB = "saved_model.pb"
VARIABLES_INDEX = "variables/variables.index"
# The SavedModel's contract (`components.train.rank.model.export_saved_model`): its signatures,
# their inputs and their outputs.
SERVING_SIGNATURE = "serving_default"
BYTES_SIGNATURE = "serving_bytes"
INPUT_NAME, BYTES_INPUT = "image", "image_bytes"
OUTPUT_NAME, CLASS_OUTPUT = "probabilities", "class_name"
DIGEST_KEY = "saved_model_sha256"  # the run summary's and the Model artifact's metadata key
_SHA256_HEX = re.compile(r"^[0-9a-f]{64}$")


class ModelError(InputError):
    """A model that is missing, not a SavedModel, or not usable; names the location."""


def fetch_model(uri: str, workdir: str | Path) -> Path:
    """A local directory holding the SavedModel at `uri` (downloaded into `workdir` for
    ``gs://``), its layout checked."""
    if not uri:
        raise ModelError("model location is empty")
    path = Path(uri)
    if storage.is_gcs(uri):
        if not storage.list_files(uri):
            raise ModelError(f"{uri}: model directory is missing (no objects under it)")
        path = storage.download_dir(uri, Path(tempfile.mkdtemp(prefix="model-", dir=workdir)))
    if not path.exists():
        raise ModelError(f"{uri}: model directory is missing")
    if not path.is_dir():
        raise ModelError(f"{uri}: not a directory (expected a SavedModel directory)")
    if not (path / SAVED_MODEL_PB).is_file():
        raise ModelError(f"{uri}: not a SavedModel (no {SAVED_MODEL_PB})")
    if not (path / VARIABLES_INDEX).is_file():
        raise ModelError(f"{uri}: SavedModel is incomplete (no {VARIABLES_INDEX})")
    return path


def check_digest_text(value: object, source: str) -> str:
    """`value` if it is a sha256 hex digest, else ModelError."""
    if not isinstance(value, str) or not _SHA256_HEX.match(value):
        raise ModelError(f"{source}: {DIGEST_KEY} {value!r} is not a sha256 hex digest")
    return value


def saved_model_sha256(local_dir: str | Path) -> str:
    """The model's digest: the sha256 of its ``saved_model.pb`` (the trainer records it)."""
    return storage.sha256_bytes((Path(local_dir) / SAVED_MODEL_PB).read_bytes())


def verify_digest(local_dir: str | Path, recorded: str | None, where: str) -> str:
    """`saved_model_sha256`; ModelError unless it equals `recorded` (when given)."""
    actual = saved_model_sha256(local_dir)
    if recorded is not None and actual != check_digest_text(recorded, where):
        raise ModelError(
            f"{where}: {SAVED_MODEL_PB} has sha256 {actual}, but the trainer recorded "
            f"{recorded}: this is not the model that was trained"
        )
    return actual


class ServingModel:
    """A loaded SavedModel's signatures, as TF Serving runs them: ``serving_default`` on image
    batches (`predict`) and, where the model has it, ``serving_bytes`` on encoded image files
    (`predict_bytes`)."""

    def __init__(self, loaded: Any, where: str) -> None:
        self.loaded, self.where = loaded, where
        signature = loaded.signatures[SERVING_SIGNATURE]
        ((self.input_name, spec),) = signature.structured_input_signature[1].items()
        self.input_shape: tuple[int, ...] = tuple(spec.shape[1:])  # one image's
        self.input_dtype: str = spec.dtype.name
        (out,) = signature.structured_outputs.values()
        self.num_classes = int(out.shape[-1])

    @property
    def takes_bytes(self) -> bool:
        return BYTES_SIGNATURE in self.loaded.signatures

    def predict(self, images: np.ndarray, batch_size: int = 256) -> np.ndarray:
        """Class probabilities ``(n, classes)`` of `images` (one image: `input_shape`)."""
        from components.common.keras_env import tensorflow

        tf = tensorflow()
        # Looked up through `loaded` on every call: the signature alone does not keep the
        # loaded object, whose deletion would free the variables it reads.
        signature = self.loaded.signatures[SERVING_SIGNATURE]
        rows = [np.zeros((0, self.num_classes), np.float32)]
        for start in range(0, len(images), batch_size):
            batch = np.asarray(images[start : start + batch_size]).astype(self.input_dtype)
            (output,) = signature(**{self.input_name: tf.constant(batch)}).values()
            rows.append(output.numpy())
        return np.concatenate(rows)

    def predict_bytes(self, encoded: list[bytes]) -> tuple[np.ndarray, list[str]]:
        """Class probabilities and the top class's name of each encoded image file."""
        from components.common.keras_env import tensorflow

        tf = tensorflow()
        if not self.takes_bytes:
            raise ModelError(
                f"{self.where}: the model has no {BYTES_SIGNATURE!r} signature (it was trained "
                "before image bytes were served): send pixel arrays"
            )
        outputs = self.loaded.signatures[BYTES_SIGNATURE](**{BYTES_INPUT: tf.constant(encoded)})
        names = [n.decode("utf-8") for n in outputs[CLASS_OUTPUT].numpy()]
        return outputs[OUTPUT_NAME].numpy(), names


def load_serving(local_dir: str | Path, where: str) -> ServingModel:
    """The fetched SavedModel's signatures (ModelError naming `where` if it is unreadable or
    has no ``serving_default``)."""
    from components.common.keras_env import tensorflow

    tf = tensorflow()
    try:
        loaded = tf.saved_model.load(str(local_dir))
    except Exception as exc:  # TF raises many types for a model it cannot read
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ModelError(f"{where}: {SAVED_MODEL_PB} is corrupt or unreadable ({reason})") from exc
    signatures = loaded.signatures
    if SERVING_SIGNATURE not in signatures:
        raise ModelError(
            f"{where}: SavedModel has no {SERVING_SIGNATURE!r} signature "
            f"(has {sorted(signatures)}); TF Serving needs it"
        )
    return ServingModel(loaded, where)
