"""A user's own models, for the ``model=package.module:function`` entry point tests.

``build`` is what a user writes; the others each get one thing wrong. Keras comes from
``keras_env`` as everywhere in this project (a user's ``import keras`` gets the same tf-keras
once the trainer has selected it).
"""

from __future__ import annotations

from typing import Any

from components.common.keras_env import keras

NOT_A_FUNCTION = 3


def build(input_shape: tuple[int, int, int], num_classes: int) -> Any:
    """A tiny CNN (what a user would bring): float32 [0, 1] images in, probabilities out."""
    k = keras()
    return k.Sequential(
        [
            k.layers.Input(shape=input_shape),
            k.layers.Conv2D(8, 3, activation="relu"),
            k.layers.MaxPooling2D(),
            k.layers.Flatten(),
            k.layers.Dense(num_classes, activation="softmax"),
        ],
        name="users_tiny_cnn",
    )


def a_layer(input_shape: tuple[int, int, int], num_classes: int) -> Any:
    return keras().layers.Dense(num_classes)


def five_classes(input_shape: tuple[int, int, int], num_classes: int) -> Any:
    k = keras()
    return k.Sequential(
        [k.layers.Input(shape=input_shape), k.layers.Flatten(), k.layers.Dense(5, "softmax")]
    )


def colour_input(input_shape: tuple[int, int, int], num_classes: int) -> Any:
    k = keras()
    return k.Sequential(
        [k.layers.Input(shape=(32, 32, 3)), k.layers.Flatten(), k.layers.Dense(num_classes)]
    )


def logits(input_shape: tuple[int, int, int], num_classes: int) -> Any:
    k = keras()
    return k.Sequential(
        [k.layers.Input(shape=input_shape), k.layers.Flatten(), k.layers.Dense(num_classes)]
    )


def needs_three_arguments(input_shape: tuple[int, int, int], num_classes: int, width: int) -> Any:
    raise AssertionError("never called with three arguments")
