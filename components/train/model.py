"""The Keras CNN. Raw 28x28 uint8 digits in, class probabilities out (scaling is in the model)."""

from __future__ import annotations

from typing import Any

from components.common import keras_env
from components.common.defaults import IMAGE_SHAPE, NUM_CLASSES


def build_model(seed: int) -> Any:
    """A small CNN, initialised identically on every rank for a given `seed`."""
    keras = keras_env.keras()
    keras.utils.set_random_seed(seed)
    return keras.Sequential(
        [
            keras.layers.Input(shape=IMAGE_SHAPE, name="image"),
            keras.layers.Rescaling(1.0 / 255),
            keras.layers.Reshape((*IMAGE_SHAPE, 1)),
            keras.layers.Conv2D(16, 3, activation="relu"),
            keras.layers.MaxPooling2D(),
            keras.layers.Conv2D(32, 3, activation="relu"),
            keras.layers.MaxPooling2D(),
            keras.layers.Flatten(),
            keras.layers.Dense(64, activation="relu"),
            keras.layers.Dense(NUM_CLASSES, activation="softmax", name="probabilities"),
        ],
        name="mnist_cnn",
    )


def weights_fingerprint(model: Any) -> str:
    """sha256 over every weight's bytes, in order: equal fingerprints mean identical models."""
    import hashlib

    digest = hashlib.sha256()
    for weight in model.get_weights():
        digest.update(weight.tobytes())
    return digest.hexdigest()
