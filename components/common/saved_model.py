"""Checks and fetching for exported models: the Model artifact's path is a TF SavedModel dir."""

from __future__ import annotations

import tempfile
from pathlib import Path

from components.common import storage

SAVED_MODEL_PB = "saved_model.pb"
VARIABLES_INDEX = "variables/variables.index"
SERVING_SIGNATURE = "serving_default"


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


def check_saved_model(local_dir: str | Path, where: str | None = None) -> None:
    """Raise ModelError unless `local_dir` is a SavedModel with a ``serving_default`` signature.

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
    from google.protobuf.message import DecodeError
    from tensorflow.core.protobuf import saved_model_pb2

    proto = saved_model_pb2.SavedModel()
    try:
        proto.ParseFromString(pb.read_bytes())
    except DecodeError as exc:
        raise ModelError(f"{name}: {SAVED_MODEL_PB} is corrupt ({exc})") from exc
    if not proto.meta_graphs:
        raise ModelError(f"{name}: {SAVED_MODEL_PB} holds no meta graph")
    signatures = set(proto.meta_graphs[0].signature_def)
    if SERVING_SIGNATURE not in signatures:
        raise ModelError(
            f"{name}: SavedModel has no {SERVING_SIGNATURE!r} signature "
            f"(has {sorted(signatures)}); TF Serving needs it"
        )
    if not (path / VARIABLES_INDEX).is_file():
        raise ModelError(f"{name}: SavedModel is incomplete (no {VARIABLES_INDEX})")
