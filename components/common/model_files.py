"""A SavedModel as files, without TensorFlow: fetching it, its layout, and its digest.

The trainer records ``saved_model_sha256`` (sha256 of ``saved_model.pb``) in the run summary and
in the Model artifact's metadata. Evaluation and registration check a model against that digest
by hashing, so the model they score or publish is the one that was trained. (Parsing the
SavedModel's protobuf needs TensorFlow: that is ``components/evaluate/saved_model.py``.)
"""

from __future__ import annotations

import hashlib
import re
import tempfile
from pathlib import Path

from components.common import storage

SAVED_MODEL_PB = "saved_model.pb"
VARIABLES_INDEX = "variables/variables.index"
DIGEST_KEY = "saved_model_sha256"  # the run summary's and the Model artifact's metadata key
_SHA256_HEX = re.compile(r"^[0-9a-f]{64}$")


class ModelError(ValueError):
    """A model directory that is missing, not a SavedModel, or not usable. Names the location."""


def fetch_model(uri: str, workdir: str | Path) -> Path:
    """A local directory holding the model at `uri` (downloaded into `workdir` for ``gs://``)."""
    if not uri:
        raise ModelError("model location is empty")
    if storage.is_gcs(uri):
        if not storage.list_files(uri):
            raise ModelError(f"{uri}: model directory is missing (no objects under it)")
        return storage.download_dir(uri, Path(tempfile.mkdtemp(prefix="model-", dir=workdir)))
    return Path(uri)


def check_layout(local_dir: str | Path, where: str | None = None) -> Path:
    """Raise ModelError unless `local_dir` has a SavedModel's files; return its saved_model.pb.

    Checks ``saved_model.pb`` and ``variables/variables.index`` are there (not what they hold).
    `where` names the model in messages (e.g. its gs:// URI); defaults to `local_dir`.
    """
    path = Path(local_dir)
    name = where or str(path)
    if not path.exists():
        raise ModelError(f"{name}: model directory is missing")
    if not path.is_dir():
        raise ModelError(f"{name}: not a directory (expected a SavedModel directory)")
    pb = path / SAVED_MODEL_PB
    if not pb.is_file():
        raise ModelError(f"{name}: not a SavedModel (no {SAVED_MODEL_PB})")
    if not (path / VARIABLES_INDEX).is_file():
        raise ModelError(f"{name}: SavedModel is incomplete (no {VARIABLES_INDEX})")
    return pb


def saved_model_sha256(local_dir: str | Path) -> str:
    """Hex sha256 of the model's ``saved_model.pb`` (the digest the trainer records)."""
    digest = hashlib.sha256()
    with open(Path(local_dir) / SAVED_MODEL_PB, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def check_digest_text(value: object, source: str) -> str:
    """`value` if it is a sha256 hex digest (64 lowercase hex characters), else ModelError."""
    if not isinstance(value, str) or not _SHA256_HEX.match(value):
        raise ModelError(f"{source}: {DIGEST_KEY} {value!r} is not a sha256 hex digest")
    return value


def verify_digest(local_dir: str | Path, recorded: str, where: str | None = None) -> str:
    """Hash the model's ``saved_model.pb``; raise ModelError unless it equals `recorded`.

    Returns the digest. The message names the model and both digests.
    """
    name = where or str(local_dir)
    actual = saved_model_sha256(local_dir)
    if actual != recorded:
        raise ModelError(
            f"{name}: {SAVED_MODEL_PB} has sha256 {actual}, but the trainer recorded "
            f"{recorded}: this is not the model that was trained"
        )
    return actual
