"""The one way into Keras: ``keras()``, never ``tf.keras``; the trainer calls it before it
imports Horovod. Code that needs only TensorFlow imports it through ``tensorflow()``.

Why: Horovod 0.28.1 does ``from keras import backend as K``, and from TF 2.16 on ``keras`` is
Keras 3, which breaks Horovod's callbacks: so select Keras 2 (tf-keras), aliased as ``keras``.
TF reads ``TF_USE_LEGACY_KERAS`` when ``tf.keras`` is first accessed, so ``keras()`` sets it
before that (nothing happens at import) and raises Keras3Loaded if Keras 3 got there first.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile
from collections.abc import Iterator
from types import ModuleType

LEGACY_KERAS_ENV = "TF_USE_LEGACY_KERAS"
# What the `tensorflow` wheel's C++ writes to stderr on import, through absl logging
# (TF_CPP_MIN_LOG_LEVEL does not reach it): 2.18 on every machine, its CUDA plugins registering
# twice; 2.21 on a machine without a GPU driver, its CUDA runtime stub saying so, twice (the
# device check's own line says which devices a rank has, and rank 0 alone shows TF's
# "failed call to cuInit": components/train/devices.py). Harmless, and printed once per process:
# once per rank in a Horovod job.
IMPORT_NOISE = re.compile(
    r"Unable to register cu(FFT|DNN|BLAS) factory: Attempting to register factory for plugin"
    r"|All log messages before absl::InitializeLog\(\) is called are written to STDERR"
    r"|cudart_stub\.cc:\d+\] Could not find cuda drivers on your machine, GPU will not be used"
)


class Keras3Loaded(RuntimeError):
    """``tf.keras`` or Horovod's Keras API was bound to Keras 3 before `keras` ran."""


def tensorflow() -> ModuleType:
    """TensorFlow with Keras 2 selected, imported without its noise.

    Without ``TF_USE_LEGACY_KERAS`` set first, TF's import also imports Keras 3 and, through it,
    scikit-learn: ``import tensorflow`` took 5.6-6.4 s that way, 4.0-4.6 s with Keras 2 selected.
    """
    os.environ[LEGACY_KERAS_ENV] = "1"
    first = "tensorflow" not in sys.modules  # the noise comes with the first import only
    with stderr_without(IMPORT_NOISE) if first else contextlib.nullcontext():
        import tensorflow as tf
    return tf


def keras() -> ModuleType:
    """Select Keras 2 and return ``tf_keras``; ``import keras`` gives it too (Horovod's ``K``)."""
    tf = tensorflow()
    import tf_keras

    sys.modules["keras"] = tf_keras
    if tf.keras.Model is not tf_keras.Model:
        raise Keras3Loaded(
            f"tf.keras was loaded as {tf.keras.Model.__module__} before "
            "components.common.keras_env.keras() selected Keras 2 (docs/versions.md)"
        )
    callbacks = sys.modules.get("horovod.tensorflow.keras.callbacks")
    if callbacks is not None and getattr(callbacks, "K", None) is not tf_keras.backend:
        raise Keras3Loaded(
            "horovod.tensorflow.keras was imported before components.common.keras_env.keras(): "
            f"its callbacks use {callbacks.K.__name__}, not tf_keras.backend (docs/versions.md)"
        )
    return tf_keras


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
