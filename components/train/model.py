"""The Keras CNN. Raw 28x28 uint8 digits in, class probabilities out (scaling is in the model)."""

from __future__ import annotations

from typing import Any

from components.common.defaults import IMAGE_SHAPE, NUM_CLASSES


def build_model(seed: int) -> Any:
    """A small CNN, initialised identically on every rank for a given `seed`."""
    import tensorflow as tf

    tf.keras.utils.set_random_seed(seed)
    return tf.keras.Sequential(
        [
            tf.keras.layers.Input(shape=IMAGE_SHAPE, name="image"),
            tf.keras.layers.Rescaling(1.0 / 255),
            tf.keras.layers.Reshape((*IMAGE_SHAPE, 1)),
            tf.keras.layers.Conv2D(16, 3, activation="relu"),
            tf.keras.layers.MaxPooling2D(),
            tf.keras.layers.Conv2D(32, 3, activation="relu"),
            tf.keras.layers.MaxPooling2D(),
            tf.keras.layers.Flatten(),
            tf.keras.layers.Dense(64, activation="relu"),
            tf.keras.layers.Dense(NUM_CLASSES, activation="softmax", name="probabilities"),
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
