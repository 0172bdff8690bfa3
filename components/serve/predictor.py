"""The predictor KServe's model server runs: a registered SavedModel's ``serving_default``
signature behind TF Serving's V1 protocol (components/serve/README.md). A request the signature
cannot take gets HTTP 400 naming the expected shape, and the server logs it in one line
(`RESTServer`). Only `components.serve.server` imports this module (it imports KServe);
TensorFlow loads with the model.
"""

from __future__ import annotations

from typing import Any

import kserve
import numpy as np
from fastapi import Request
from fastapi.responses import JSONResponse
from kserve.errors import InvalidInput
from kserve.logging import logger
from kserve.protocol.rest.server import RESTServer as KServeRESTServer

from components.common.defaults import IMAGE_SHAPE, SERVE_MAX_BATCH
from components.common.model_files import load_serving


def to_batch(payload: Any, max_batch: int) -> np.ndarray:
    """The request's instances as a float32 ``(n, 28, 28)`` array, else InvalidInput (400)
    naming the expected shape."""
    rows, cols = IMAGE_SHAPE
    want = (
        f'expected {{"instances": [...]}} of shape (n, {rows}, {cols}), 1 <= n <= {max_batch}: '
        f"n raw {rows}x{cols} digits, pixel values 0..255"
    )
    if not isinstance(payload, dict):
        raise InvalidInput(
            f"the body is not a JSON object (send it with Content-Type: application/json): {want}"
        )
    instances = payload.get("instances")
    if not isinstance(instances, list):
        raise InvalidInput(f'no "instances" list in the request: {want}')
    try:
        batch = np.asarray(instances)
    except ValueError:  # ragged nesting
        raise InvalidInput(f"instances are ragged (rows of different lengths): {want}") from None
    if batch.ndim != 3 or batch.shape[1:] != IMAGE_SHAPE or not 1 <= len(batch) <= max_batch:
        raise InvalidInput(f"instances have shape {batch.shape}: {want}")
    if batch.dtype.kind not in "iuf":
        raise InvalidInput(f"instances hold {batch.dtype} values, not numbers: {want}")
    if not np.isfinite(batch).all() or batch.min() < 0 or batch.max() > 255:
        raise InvalidInput(f"pixel values span {batch.min()}..{batch.max()}: {want}")
    return batch.astype(np.float32)


class DigitPredictor(kserve.Model):  # type: ignore[misc]
    """The SavedModel at `model_dir` served as `name` (the URL's ``/v1/models/<name>``)."""

    def __init__(self, name: str, model_dir: str, max_batch: int = SERVE_MAX_BATCH) -> None:
        super().__init__(name)
        self.model_dir, self.max_batch = model_dir, max_batch
        self._predict: Any = None

    def load(self) -> bool:
        self._predict = load_serving(self.model_dir, self.model_dir)
        self.ready = True
        return self.ready

    def predict(self, payload: Any, headers: Any = None) -> dict[str, Any]:  # type: ignore[override]
        return {"predictions": self._predict(to_batch(payload, self.max_batch)).tolist()}


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
