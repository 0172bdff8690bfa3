"""The predictor KServe's model server runs in ``make serve``'s process: a registered SavedModel's
signatures behind TF Serving's V1 protocol (components/serve/README.md). Only
`components.serve.server` imports this module (it imports KServe); TensorFlow loads with the
model.
"""

from __future__ import annotations

import base64
import binascii
from typing import Any

import kserve
import numpy as np
from fastapi import Request
from fastapi.responses import JSONResponse
from kserve.errors import InvalidInput
from kserve.logging import logger
from kserve.protocol.rest.server import RESTServer as KServeRESTServer

from components.common.defaults import SERVE_MAX_BATCH
from components.common.model_files import (
    BYTES_INPUT,
    BYTES_SIGNATURE,
    CLASS_OUTPUT,
    OUTPUT_NAME,
    SERVING_SIGNATURE,
    ServingModel,
    load_serving,
)


def expected(served: ServingModel, max_batch: int) -> str:
    """What a request must be, in words, for a 400's message."""
    shape = ", ".join(str(d) for d in served.input_shape)
    one_channel = served.input_shape[-1:] == (1,)
    pixels = f"(n, {shape})" + (f" or (n, {shape.rsplit(', ', 1)[0]})" if one_channel else "")
    files = ' or n {"b64": "<a JPEG, PNG, BMP or GIF file, base64>"}' if served.takes_bytes else ""
    return (
        f'expected {{"instances": [...]}} of 1 <= n <= {max_batch} images: pixel arrays of '
        f"shape {pixels}, values 0..255{files}"
    )


def encoded_images(instances: list[Any], want: str) -> list[bytes] | None:
    """The files of a request whose instances are all ``{"b64": ...}`` (or TF Serving's named
    form ``{"image_bytes": {"b64": ...}}``), None for one that has none; InvalidInput for a mix
    or bad base64."""
    unwrapped = [i.get(BYTES_INPUT, i) if isinstance(i, dict) else i for i in instances]
    kinds = {isinstance(i, dict) and set(i) == {"b64"} for i in unwrapped}
    if kinds == {False}:
        return None
    if kinds != {True}:
        raise InvalidInput(f'instances mix {{"b64": ...}} files with other values: {want}')
    try:
        return [base64.b64decode(i["b64"], validate=True) for i in unwrapped]
    except (binascii.Error, TypeError, ValueError) as exc:
        raise InvalidInput(f'an instance\'s "b64" is not valid base64 ({exc}): {want}') from None


def to_pixels(instances: list[Any], served: ServingModel, want: str) -> np.ndarray:
    """The request's pixel arrays at the model's input shape, else InvalidInput naming it."""
    try:
        batch = np.asarray(instances)
    except ValueError:  # ragged nesting
        raise InvalidInput(f"instances are ragged (rows of different lengths): {want}") from None
    shape, sent = served.input_shape, batch.shape
    if batch.ndim == len(shape) and shape[-1:] == (1,):  # (n, height, width) of a 1-channel model
        batch = batch[..., None]
    if batch.shape[1:] != shape:
        raise InvalidInput(f"instances have shape {sent}: {want}")
    if batch.dtype.kind not in "iuf":
        raise InvalidInput(f"instances hold {batch.dtype} values, not numbers: {want}")
    if not np.isfinite(batch).all() or batch.min() < 0 or batch.max() > 255:
        raise InvalidInput(f"pixel values span {batch.min()}..{batch.max()}: {want}")
    return batch


# Pixel arrays go to ``serving_default``; encoded image files, sent as TF Serving's binary form
# ``{"b64": "..."}``, go to ``serving_bytes``, which decodes and resizes them inside the model as
# data prep did. A request the model cannot take gets HTTP 400 naming what it expects, and the
# server logs it in one line (`RESTServer`).
def answer(payload: Any, served: ServingModel, max_batch: int) -> dict[str, Any]:
    """The V1 protocol's answer to `payload` (InvalidInput for a request it cannot take):
    ``{"predictions": [[p, ...], ...]}`` for pixel arrays; for files, as TF Serving answers a
    signature of two outputs, ``{"predictions": [{"probabilities": [...], "class_name":
    "..."}, ...]}``."""
    want = expected(served, max_batch)
    if not isinstance(payload, dict):
        raise InvalidInput(
            f"the body is not a JSON object (send it with Content-Type: application/json): {want}"
        )
    instances = payload.get("instances")
    if not isinstance(instances, list):
        raise InvalidInput(f'no "instances" list in the request: {want}')
    if not 1 <= len(instances) <= max_batch:
        raise InvalidInput(f"{len(instances)} instances: {want}")
    signature = payload.get("signature_name", "")
    files = encoded_images(instances, want)
    if signature not in ("", SERVING_SIGNATURE if files is None else BYTES_SIGNATURE):
        kind = "pixel arrays" if files is None else 'files ({"b64": ...})'
        raise InvalidInput(f"signature_name {signature!r} does not take {kind}: {want}")
    if files is None:
        return {"predictions": served.predict(to_pixels(instances, served, want)).tolist()}
    if not served.takes_bytes:
        raise InvalidInput(f"this model has no {BYTES_SIGNATURE!r} signature: {want}")
    try:
        probabilities, names = served.predict_bytes(files)
    except Exception as exc:  # TensorFlow's InvalidArgumentError for a file it cannot decode
        first = str(getattr(exc, "message", exc)).strip().splitlines()[0].split("}} ")[-1]
        raise InvalidInput(f"an image file cannot be decoded ({first}): {want}") from None
    return {
        "predictions": [
            {OUTPUT_NAME: row.tolist(), CLASS_OUTPUT: name}
            for row, name in zip(probabilities, names, strict=True)
        ]
    }


class ImagePredictor(kserve.Model):  # type: ignore[misc]
    """The SavedModel at `model_dir` served as `name` (the URL's ``/v1/models/<name>``)."""

    def __init__(self, name: str, model_dir: str, max_batch: int = SERVE_MAX_BATCH) -> None:
        super().__init__(name)
        self.model_dir, self.max_batch = model_dir, max_batch
        self._served: ServingModel | None = None

    def load(self) -> bool:
        self._served = load_serving(self.model_dir, self.model_dir)
        self.ready = True
        return self.ready

    def predict(self, payload: Any, headers: Any = None) -> dict[str, Any]:  # type: ignore[override]
        assert self._served is not None, "load() first"
        return answer(payload, self._served, self.max_batch)


async def rejected(request: Request, exc: InvalidInput) -> JSONResponse:
    """HTTP 400 with the reason, as KServe's own handler answers, logged in one line: a bad
    request is the client's mistake, not the server's, and needs no traceback."""
    logger.warning("rejected %s %s (400): %s", request.method, request.url.path, exc)
    return JSONResponse(status_code=400, content={"error": str(exc)})


class RESTServer(KServeRESTServer):  # type: ignore[misc]
    """KServe's REST server, a rejected request (`InvalidInput`) logged by `rejected`."""

    def create_application(self) -> None:
        from kserve.model_server import app  # the application KServe's own method sets up

        super().create_application()
        app.add_exception_handler(InvalidInput, rejected)
