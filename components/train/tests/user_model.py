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


@keras.saving.register_keras_serializable(package="user_model")
class FirstCallSpike(layers.Layer):
    """Multiplies its input by `factor` in its first training call, by 1 after (it counts its
    training calls): a factor past float16's range overflows that step under mixed precision."""

    def __init__(self, factor: float = 1.0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.factor = factor

    def build(self, input_shape: Any) -> None:
        self.calls = self.add_weight(shape=(), initializer="zeros", trainable=False, name="calls")

    def call(self, x: Any, training: bool = False) -> Any:
        if not training:
            return x
        scale = ops.where(ops.equal(self.calls, 0.0), self.factor, 1.0)
        self.calls.assign_add(1.0)
        return x * ops.cast(scale, x.dtype)

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "factor": self.factor}


def rank_1_overflows_first(input_shape: tuple[int, int, int], num_classes: int) -> Any:
    """`sequential` behind a `FirstCallSpike` that on rank 1 alone multiplies the first batch by
    1e5 (float16 holds at most 65504): under mixed precision rank 1's first step overflows and
    rank 0's does not."""
    import horovod.tensorflow as hvd

    rank = hvd.rank() if hvd.is_initialized() else 0
    inner = sequential(input_shape, num_classes)
    inputs = keras.Input(shape=input_shape)
    outputs = inner(FirstCallSpike(1e5 if rank == 1 else 1.0)(inputs))
    return keras.Model(inputs, outputs, name="rank_1_overflows_first")
