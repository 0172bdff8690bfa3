"""The one way into TensorFlow and Keras: ``tensorflow()`` and ``keras()``, Keras 3 on its
TensorFlow backend. Used by every process that imports TensorFlow: each rank, the data prep and
evaluate steps' pods, the launcher's preflight and ``make serve``. Nothing happens at import.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile
from collections.abc import Iterator
from types import ModuleType

from components.common.failure import InputError

# Keras is Keras 3 (``keras``, which ``tf.keras`` also is from TF 2.16 on) on its TensorFlow
# backend: Horovod's collectives are TensorFlow ops, and the project's Horovod patch series
# (make/horovod/patches) makes Horovod's Keras API work on Keras 3 there. ``keras()`` refuses
# another Keras backend (``KERAS_BACKEND``) by name; `check_not_tf_keras` refuses tf-keras, the
# legacy Keras 2 package, where a user's model module brought it in.
KERAS_BACKEND_ENV = "KERAS_BACKEND"
TF_KERAS = "tf_keras"
# What the `tensorflow` wheel's C++ writes to stderr on import, through absl logging
# (TF_CPP_MIN_LOG_LEVEL does not reach it): 2.18 on every machine, its CUDA plugins registering
# twice; 2.21 on a machine without a GPU driver, its CUDA runtime stub saying so, twice (the device
# check's own line says which devices a rank has, and rank 0 alone shows TF's "failed call to
# cuInit": components/train/rank/devices.py). Harmless, and printed once per process: once per rank
# in a Horovod job.
IMPORT_NOISE = re.compile(
    r"Unable to register cu(FFT|DNN|BLAS) factory: Attempting to register factory for plugin"
    r"|All log messages before absl::InitializeLog\(\) is called are written to STDERR"
    r"|cudart_stub\.cc:\d+\] Could not find cuda drivers on your machine, GPU will not be used"
)


class KerasSetupError(InputError):
    """Keras is not Keras 3 on TensorFlow, or a model module brought in tf-keras."""


def tensorflow() -> ModuleType:
    """TensorFlow, imported without its noise."""
    first = "tensorflow" not in sys.modules  # the noise comes with the first import only
    with stderr_without(IMPORT_NOISE) if first else contextlib.nullcontext():
        import tensorflow as tf
    return tf


def keras() -> ModuleType:
    """Keras 3 on the TensorFlow backend (KerasSetupError for any other backend)."""
    keras_backend = os.environ.get(KERAS_BACKEND_ENV, "tensorflow")
    if keras_backend != "tensorflow":  # checked before Keras reads it: it cannot change afterwards
        raise KerasSetupError(
            f"{KERAS_BACKEND_ENV}={keras_backend}: Horovod's collectives are TensorFlow ops, so "
            "the trainer runs Keras 3 on its TensorFlow backend; "
            f"unset {KERAS_BACKEND_ENV} or set it to tensorflow"
        )
    tensorflow()
    import keras as keras3

    if keras3.backend.backend() != "tensorflow":
        raise KerasSetupError(
            f"Keras runs on its {keras3.backend.backend()} backend (~/.keras/keras.json?); the "
            "trainer needs the TensorFlow backend: set KERAS_BACKEND=tensorflow"
        )
    return keras3


def check_not_tf_keras(what: str, loaded_before: set[str]) -> None:
    """KerasSetupError if `what` (a model module being imported) brought in tf-keras: its
    layers and models are Keras 2 objects, which Keras 3 and the Horovod build cannot train."""
    if TF_KERAS in sys.modules and TF_KERAS not in loaded_before:
        raise KerasSetupError(
            f"{what} imports tf_keras, the legacy Keras 2 package; the trainer runs Keras 3: "
            "write the model with `import keras` (or `from tensorflow import keras`)"
        )


@contextlib.contextmanager
def stderr_without(noise: re.Pattern[str]) -> Iterator[None]:
    """Hold back what native code writes to stderr (fd 2) in the block, then pass on every
    line but those `noise` matches."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            held.seek(0)
            lines = held.read().decode(errors="replace").splitlines(keepends=True)
            sys.stderr.write("".join(line for line in lines if not noise.search(line)))
            sys.stderr.flush()
