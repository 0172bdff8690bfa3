"""The ``augment`` option: Horovod's keras_mnist_advanced.py augmentation as Keras layers inside
the model, after the scaling. Built in each rank; the layers act in ``fit`` only.
"""

from __future__ import annotations

import functools
import math
from typing import Any

# The example's ``ImageDataGenerator(rotation_range=8, width_shift_range=0.08,
# height_shift_range=0.08, shear_range=0.3, zoom_range=0.08)`` as layers inside the model, so they
# run where the model runs and Horovod sees nothing new: RandomRotation (8/360), RandomTranslation
# (0.08), `RandomShear` (0.3 *degrees*, as the generator reads ``shear_range``; Keras' own
# RandomShear takes a fraction) and RandomZoom (0.08), all filling with the nearest pixel and
# interpolating bilinearly. Unlike the generator, each layer resamples on its own.
#
# They act in ``fit`` only (``training=True``); ``predict``, ``evaluate`` and the SavedModel's
# signature pass images through. They have no weights, so the initial weights stay identical on
# every rank, and their draws follow the trainer's seed.
FILL_MODE = "nearest"  # the generator's fill_mode


def augmentation_layers(keras: Any) -> list[Any]:
    """The augmentation, as layers on ``(28, 28, 1)`` float images."""
    return [
        keras.layers.RandomRotation(8 / 360, fill_mode=FILL_MODE, name="rotate"),
        keras.layers.RandomTranslation(0.08, 0.08, fill_mode=FILL_MODE, name="shift"),
        random_shear_class(keras)(0.3, name="shear"),
        keras.layers.RandomZoom(0.08, 0.08, fill_mode=FILL_MODE, name="zoom"),
    ]


@functools.cache
def random_shear_class(keras: Any) -> type:
    """The `RandomShear` layer class (made once Keras is selected: see keras_env)."""
    import tensorflow as tf

    class RandomShear(keras.layers.Layer):  # type: ignore[misc, name-defined]
        """Shear each image by a random angle in ``[-degrees, degrees]`` (`shear_transforms`),
        unless called with ``training=False``."""

        def __init__(self, degrees: float, **kwargs: Any) -> None:
            super().__init__(**kwargs)
            self.degrees = float(degrees)

        def call(self, images: Any, training: Any = True) -> Any:
            if not training or not self.degrees:
                return images
            batch = tf.shape(images)[0]
            limit = math.radians(self.degrees)
            angles = tf.random.uniform([batch], -limit, limit)
            sheared = tf.raw_ops.ImageProjectiveTransformV3(
                images=images,
                transforms=shear_transforms(tf, angles, tf.shape(images)[1]),
                output_shape=tf.shape(images)[1:3],
                fill_value=0.0,
                interpolation="BILINEAR",
                fill_mode=FILL_MODE.upper(),
            )
            sheared.set_shape(images.shape)
            return sheared

        def get_config(self) -> dict[str, Any]:
            return {**super().get_config(), "degrees": self.degrees}

    return RandomShear


def shear_transforms(tf: Any, angles: Any, height: Any) -> Any:
    """One projective transform per angle, ``[a0, a1, a2, b0, b1, b2, 0, 0]``: each output pixel
    ``(x, y)`` samples the input at ``(a0 x + a1 y + a2, b0 x + b1 y + b2)``.

    ImageDataGenerator's shear matrix in x/y axes, ``[[1, -sin a], [0, cos a]]`` about the
    centre: ``x' = x - sin(a) (y - c)`` and ``y' = cos(a) (y - c) + c``, ``c = (height - 1) / 2``.
    """
    centre = (tf.cast(height, tf.float32) - 1.0) / 2.0
    cos, sin = tf.cos(angles), tf.sin(angles)
    zeros, ones = tf.zeros_like(angles), tf.ones_like(angles)
    columns = [ones, -sin, sin * centre, zeros, cos, centre - cos * centre, zeros, zeros]
    return tf.stack(columns, axis=1)
