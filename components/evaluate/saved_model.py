"""The SavedModel check of the component that loads models: TF's protobufs parse saved_model.pb.

The TensorFlow-free parts (fetching, layout, digest) are in ``components/common/model_files.py``.
"""

from __future__ import annotations

from pathlib import Path

from components.common import keras_env
from components.common.model_files import SAVED_MODEL_PB, ModelError, check_layout

SERVING_SIGNATURE = "serving_default"


def check_saved_model(local_dir: str | Path, where: str | None = None) -> None:
    """Raise ModelError unless `local_dir` is a SavedModel with a ``serving_default`` signature.

    `where` names the model in messages (e.g. its gs:// URI); defaults to `local_dir`.
    """
    name = where or str(local_dir)
    pb = check_layout(local_dir, name)
    keras_env.tensorflow()  # the protobuf module below imports all of TF: with Keras 2 selected
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
