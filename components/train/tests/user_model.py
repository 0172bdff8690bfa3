"""A user's own models, for the ``model=package.module:function`` entry point tests.

``build`` is what a Keras 3 user writes: ``import keras``, ``keras.ops``, a custom layer and
the functional API. ``sequential`` is Keras 2 style code that Keras 3 still runs. The others
each get one thing wrong.
"""

from __future__ import annotations

from typing import Any

import keras
from keras import layers, ops

NOT_A_FUNCTION = 3


@keras.saving.register_keras_serializable(package="user_model")
class CentredSquare(layers.Layer):
    """A custom layer written with ``keras.ops``: (x - mean(x))^2 per image, plus x."""

    def call(self, x: Any) -> Any:
        centred = x - ops.mean(x, axis=(1, 2, 3), keepdims=True)
        return x + ops.square(centred)


def build(input_shape: tuple[int, int, int], num_classes: int) -> Any:
    """A tiny functional CNN with a custom layer: float32 [0, 1] images in, probabilities out."""
    inputs = keras.Input(shape=input_shape)
    x = CentredSquare()(inputs)
    x = layers.Conv2D(8, 3, activation="relu")(x)
    x = layers.MaxPooling2D()(x)
    x = layers.Flatten()(x)
    outputs = layers.Dense(num_classes, activation="softmax")(x)
    return keras.Model(inputs, outputs, name="users_tiny_cnn")


def per_rank_weights(input_shape: tuple[int, int, int], num_classes: int) -> Any:
    """`build`, but every rank draws its own initial weights, as a model that seeds itself from
    the rank would: the ranks train one model only because rank 0's state is broadcast."""
    import horovod.tensorflow as hvd

    keras.utils.set_random_seed(1000 + (hvd.rank() if hvd.is_initialized() else 0))
    return build(input_shape, num_classes)


def sequential(input_shape: tuple[int, int, int], num_classes: int) -> Any:
    """Keras 2 style: a plain Sequential of built-in layers, which Keras 3 runs as it is."""
    return keras.Sequential(
        [
            keras.layers.Input(shape=input_shape),
            keras.layers.Conv2D(8, 3, activation="relu"),
            keras.layers.MaxPooling2D(),
            keras.layers.Flatten(),
            keras.layers.Dense(num_classes, activation="softmax"),
        ],
        name="users_sequential",
    )


def a_layer(input_shape: tuple[int, int, int], num_classes: int) -> Any:
    return layers.Dense(num_classes)


def five_classes(input_shape: tuple[int, int, int], num_classes: int) -> Any:
    return keras.Sequential([keras.Input(shape=input_shape), layers.Flatten(), layers.Dense(5)])


def colour_input(input_shape: tuple[int, int, int], num_classes: int) -> Any:
    return keras.Sequential(
        [keras.Input(shape=(32, 32, 3)), layers.Flatten(), layers.Dense(num_classes)]
    )


def logits(input_shape: tuple[int, int, int], num_classes: int) -> Any:
    return keras.Sequential(
        [keras.Input(shape=input_shape), layers.Flatten(), layers.Dense(num_classes)]
    )


def needs_three_arguments(input_shape: tuple[int, int, int], num_classes: int, width: int) -> Any:
    raise AssertionError("never called with three arguments")
