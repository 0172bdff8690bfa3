"""An image's way from its file's bytes to the pixels a model sees: decoded, brought to the
dataset's colour, resized (TensorFlow ops; `tf` is passed in). Runs in the data prep step's pod
on every image it prepares, and inside the exported model's ``serving_bytes`` signature wherever
the model serves, so a served image meets the network exactly as a training image did.
"""

from __future__ import annotations

from typing import Any

# - Decoding: JPEG, PNG, BMP and GIF (its first frame), the formats of Keras's
#   ``image_dataset_from_directory``; an alpha channel is dropped.
# - Colour: 1 channel (grayscale) or 3 (RGB), converted with ``tf.image.rgb_to_grayscale`` and
#   ``tf.image.grayscale_to_rgb``.
# - Size: bilinear with antialiasing (``tf.image.resize``), rounded to ``uint8``; an image already
#   at the size is left as it is.
#
# The file extensions an image folder's images may have (Keras's own list), lower case.
EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".gif")
COLOR_MODES = ("auto", "grayscale", "rgb")


def decode(tf: Any, encoded: Any) -> Any:
    """An image file's bytes as ``uint8`` (height, width, 1 or 3): its own colour, without
    alpha. Raises TensorFlow's InvalidArgumentError for bytes it cannot decode."""
    image = tf.io.decode_image(encoded, channels=0, expand_animations=False)
    # eagerly the channels are known (one operation an image); in a function they are not
    channels = image.shape[-1] if image.shape[-1] is not None else tf.shape(image)[-1]
    if isinstance(channels, int) and channels % 2:
        return image
    # 2 (gray, alpha) -> 1; 4 (RGB, alpha) -> 3; 1 and 3 unchanged
    return image[..., : channels - (1 - channels % 2)]


def to_channels(tf: Any, image: Any, channels: int) -> Any:
    """`image` (1 or 3 channels) with `channels` channels."""
    own = tf.shape(image)[-1]
    if channels == 1:
        converted = tf.cond(
            tf.equal(own, 3), lambda: tf.image.rgb_to_grayscale(image), lambda: image
        )
    else:
        converted = tf.cond(
            tf.equal(own, 1), lambda: tf.image.grayscale_to_rgb(image), lambda: image
        )
    return tf.ensure_shape(converted, [None, None, channels])


def resize(tf: Any, image: Any, height: int, width: int) -> Any:
    """`image` at `height` x `width`: bilinear, antialiased, rounded to ``uint8``."""
    shape = tf.shape(image)

    def resized() -> Any:
        scaled = tf.image.resize(
            tf.cast(image, tf.float32), [height, width], method="bilinear", antialias=True
        )
        return tf.cast(tf.clip_by_value(tf.round(scaled), 0.0, 255.0), tf.uint8)

    same = tf.logical_and(tf.equal(shape[0], height), tf.equal(shape[1], width))
    return tf.ensure_shape(tf.cond(same, lambda: image, resized), [height, width, None])


def prepare(tf: Any, encoded: Any, height: int, width: int, channels: int) -> Any:
    """An image file's bytes as the ``uint8`` (height, width, channels) pixels a model of a
    dataset of that shape takes."""
    return resize(tf, to_channels(tf, decode(tf, encoded), channels), height, width)
