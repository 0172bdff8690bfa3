"""The trainer's models (the ``model`` parameter: a built-in one or the user's
``package.module:function``) and the one SavedModel rank 0 exports. Built in each rank, and in
the launcher's preflight (does the model take the dataset's images?).
"""

from __future__ import annotations

import importlib
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from components.common import images, keras_env
from components.common.dataset import ImageSpec
from components.common.defaults import AUGMENT, MODEL, MODELS
from components.common.failure import InputError
from components.common.model_files import (
    BYTES_INPUT,
    BYTES_SIGNATURE,
    CLASS_OUTPUT,
    INPUT_NAME,
    OUTPUT_NAME,
    SERVING_SIGNATURE,
)
from components.train.config import model_problem

# The bundled digits' shape and classes: the defaults of `build_model`.
MNIST_SHAPE, MNIST_CLASSES = (28, 28, 1), 10


# Every model takes the dataset's raw ``uint8`` images (input ``image``, height x width x channels)
# and gives class probabilities (output ``probabilities``), the scaling to [0, 1] inside. The
# ``model`` parameter picks one:
#
# - ``mnist_advanced`` (the default): the network of Horovod's ``keras_mnist_advanced.py``.
# - ``small``: the project's first CNN; a seed gives it the same initial weights the project's first
#   trainer did, so results made with it reproduce (components/train/tests/test_model.py compares
#   the two).
# - ``mobilenet_v3_small``: Keras's MobileNetV3Small (``keras.applications``, no pretrained
#   weights), for larger colour images (32x32 and up); the two above flatten their last feature map
#   into a dense layer, whose size grows with the image.
# - ``package.module:function``: the user's own, called as ``function(input_shape, num_classes)``
#   with the dataset's values, e.g. ``function((28, 28, 1), 10)``: a Keras 3 model (``import
#   keras``: layers, ``keras.ops``, custom layers, functional or Sequential) from float32 images
#   scaled to [0, 1] (as the Horovod example feeds them) to softmax probabilities, wrapped between
#   the ``image`` input, the scaling and ``probabilities``. A module that brings in tf-keras (Keras
#   2) is refused by name.
#
# `build_model` seeds every random generator with the run's seed first, so every rank builds the
# same initial weights. The output layer computes in float32 whatever the dtype policy (Keras's
# advice for a softmax under ``mixed_precision``), so the probabilities are float32 too.
# `export_saved_model` writes the one SavedModel with two signatures: ``serving_default`` (a
# ``uint8`` image batch at the dataset's shape in, ``probabilities`` out) and ``serving_bytes``
# (encoded JPEG, PNG, BMP or GIF files in, decoded and resized inside the model as data prep did,
# ``probabilities`` and the top class's name out).
class ModelChoiceError(InputError):
    """The ``model`` parameter names no model the trainer can build."""


def _small(keras: Any, num_classes: int) -> list[Any]:
    return [
        keras.layers.Conv2D(16, 3, activation="relu"),
        keras.layers.MaxPooling2D(),
        keras.layers.Conv2D(32, 3, activation="relu"),
        keras.layers.MaxPooling2D(),
        keras.layers.Flatten(),
        keras.layers.Dense(64, activation="relu"),
        keras.layers.Dense(num_classes, activation="softmax", dtype="float32", name=OUTPUT_NAME),
    ]


def _mnist_advanced(keras: Any, num_classes: int) -> list[Any]:
    return [
        keras.layers.Conv2D(32, kernel_size=(3, 3), activation="relu"),
        keras.layers.Conv2D(64, (3, 3), activation="relu"),
        keras.layers.MaxPooling2D(pool_size=(2, 2)),
        keras.layers.Dropout(0.25),
        keras.layers.Flatten(),
        keras.layers.Dense(128, activation="relu"),
        keras.layers.Dropout(0.5),
        keras.layers.Dense(num_classes, activation="softmax", dtype="float32", name=OUTPUT_NAME),
    ]


def _mobilenet_v3_small(keras: Any, num_classes: int, shape: tuple[int, ...]) -> list[Any]:
    """MobileNetV3Small, untrained, on images scaled to [0, 1] (its own preprocessing off)."""
    network = keras.applications.MobileNetV3Small(
        input_shape=shape,
        weights=None,
        classes=num_classes,
        include_preprocessing=False,
        classifier_activation="softmax",
    )
    return [network, keras.layers.Activation("linear", dtype="float32", name=OUTPUT_NAME)]


# Built-in model -> (the Keras model's name, its layers after the scaling, the smallest image
# side it takes). Names: MODELS.
BUILT_IN: dict[str, tuple[str, Callable[..., list[Any]], int]] = {
    "mnist_advanced": ("mnist_advanced", _mnist_advanced, 6),
    "small": ("mnist_cnn", _small, 10),
    "mobilenet_v3_small": ("mobilenet_v3_small", _mobilenet_v3_small, 32),
}
assert tuple(BUILT_IN) == MODELS, "defaults.MODELS names the built-in models"


def built_in_problem(model: str, shape: tuple[int, ...]) -> str | None:
    """Why built-in `model` cannot take images of `shape`, or None."""
    smallest = BUILT_IN[model][2]
    if min(shape[:2]) >= smallest:
        return None
    return (
        f"model {model!r} takes images of {smallest}x{smallest} pixels or more, and the "
        f"dataset's are {shape[0]}x{shape[1]}: set image_size to {smallest} or more, or "
        "choose another model"
    )


def build_model(
    seed: int,
    model: str = MODEL,
    augment: bool = AUGMENT,
    shape: tuple[int, ...] = MNIST_SHAPE,
    num_classes: int = MNIST_CLASSES,
) -> Any:
    """The Keras model `model` for ``uint8`` images of `shape` (height, width, channels) and
    `num_classes` classes, initialised identically on every rank for a given `seed`
    (ModelChoiceError if it does not take such images, or a user's model does not import,
    build or fit)."""
    try:
        keras = keras_env.keras()
    except keras_env.KerasSetupError as exc:  # the backend is not TensorFlow
        raise ModelChoiceError(str(exc)) from exc
    keras.utils.set_random_seed(seed)
    front = [
        keras.layers.Input(shape=shape, dtype="uint8", name=INPUT_NAME),
        keras.layers.Rescaling(1.0 / 255),
    ]
    if model in BUILT_IN:
        name, layers, _ = BUILT_IN[model]
        problem = built_in_problem(model, shape)
        if problem:
            raise ModelChoiceError(problem)
        extra = (tuple(shape),) if model == "mobilenet_v3_small" else ()
        built = keras.Sequential([*front, *layers(keras, num_classes, *extra)], name=name)
    else:
        built = _user_model(keras, model, front, tuple(shape), num_classes)
    return _with_augmentation(keras, built, shape) if augment else built


def _with_augmentation(keras: Any, built: Any, shape: tuple[int, ...]) -> Any:
    """`built` with the augmentation layers after its scaling. Its layers are reused as built:
    augmentation layers made first would shift the weights' random draws."""
    from components.train.rank.augment import augmentation_layers

    image = keras.layers.Input(shape=shape, dtype="uint8", name=INPUT_NAME)
    layers = [image, built.layers[0], *augmentation_layers(keras), *built.layers[1:]]
    return keras.Sequential(layers, name=built.name)


def _user_model(
    keras: Any, model: str, front: list[Any], shape: tuple[int, ...], num_classes: int
) -> Any:
    """``function(shape, num_classes)`` of ``package.module:function`` between `front` and
    ``probabilities``, or ModelChoiceError saying why it does not fit."""
    function = import_model_function(model)
    try:
        built = function(shape, num_classes)
    except Exception as exc:
        raise ModelChoiceError(
            f"model {model!r}: calling it as {model.split(':')[1]}(input_shape={shape}, "
            f"num_classes={num_classes}) raised {type(exc).__name__}: {exc}"
        ) from exc
    if not isinstance(built, keras.Model):
        made = f"{type(built).__module__}.{type(built).__qualname__}"
        keras2 = " (a tf-keras, Keras 2, object: build it with `import keras`)"
        raise ModelChoiceError(
            f"model {model!r} returned {made}, not a Keras 3 model (keras.Model, e.g. "
            f"keras.Sequential){keras2 if made.startswith(keras_env.TF_KERAS) else ''}"
        )
    try:
        wrapped = keras.Sequential(
            [*front, built, keras.layers.Activation("linear", dtype="float32", name=OUTPUT_NAME)],
            name="user_model",
        )
    except Exception as exc:  # Keras says why the input does not fit in its own words
        reason = next(
            (
                line
                for line in _plain(str(exc)).splitlines()
                if line.strip() and "encountered" not in line
            ),
            type(exc).__name__,
        )  # Keras' reason, without its "Exception encountered when calling layer" wrapping
        raise ModelChoiceError(
            f"model {model!r} does not take the trainer's images, float32 batches of shape "
            f"(None, {', '.join(map(str, shape))}) scaled to [0, 1]: {reason}"
        ) from exc
    got = wrapped.output_shape
    if not isinstance(got, tuple) or tuple(got) != (None, num_classes):
        raise ModelChoiceError(
            f"model {model!r} returns outputs of shape {got}; the trainer needs "
            f"(None, {num_classes}): one probability per class"
        )
    return wrapped


def import_model_function(model: str) -> Callable[..., Any]:
    """The user's ``package.module:function``, imported (ModelChoiceError naming what is
    wrong: the form, the import, or a name that is no function)."""
    problem = model_problem(model)
    if problem:
        raise ModelChoiceError(problem)
    module_name, function_name = model.split(":")
    module = _import_model_module(model, module_name)
    function = getattr(module, function_name, None)
    if not callable(function):
        found = "is not callable" if hasattr(module, function_name) else "is not defined"
        raise ModelChoiceError(
            f"model {model!r}: {function_name!r} {found} in module {module_name!r} "
            f"({getattr(module, '__file__', None) or 'no file'})"
        )
    return function


def _plain(text: str) -> str:
    """`text` without the terminal colour codes Keras 3 puts in its errors."""
    return re.sub(r"\x1b\[[0-9;]*m", "", text)


def _import_model_module(model: str, module_name: str) -> Any:
    """The user's model module, or ModelChoiceError: it does not import, or it brings in
    tf-keras (Keras 2), whose models Keras 3 cannot train."""
    keras2 = f"model {model!r}: module {module_name!r}"
    loaded_before = set(sys.modules)
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # the user's module may fail in any way while importing
        if isinstance(exc, ModuleNotFoundError) and exc.name == keras_env.TF_KERAS:
            reason = f"{keras2} imports tf_keras, the legacy Keras 2 package, which"
            raise ModelChoiceError(
                f"{reason} the trainer does not have: it runs Keras 3, so write the model "
                "with `import keras` (or `from tensorflow import keras`)"
            ) from exc
        raise ModelChoiceError(
            f"model {model!r}: cannot import module {module_name!r} "
            f"({type(exc).__name__}: {exc}): install it where the trainer runs, or put its "
            "folder on PYTHONPATH there"
        ) from exc
    try:
        keras_env.check_not_tf_keras(keras2, loaded_before)
    except keras_env.KerasSetupError as exc:
        raise ModelChoiceError(str(exc)) from exc
    return module


def export_saved_model(
    model: Any, path: Path, image: ImageSpec, classes: tuple[str, ...] | list[str]
) -> None:
    """`model` as a SavedModel, through Keras 3's own `ExportArchive`, with two signatures:
    ``serving_default``, a ``uint8`` batch ``image`` of the dataset's (height, width, channels)
    in and ``probabilities`` out (the contract evaluate, register, serving and TF Serving
    read); and ``serving_bytes``, encoded image files ``image_bytes`` in (decoded, recoloured
    and resized as data prep does, `components.common.images`), ``probabilities`` and
    ``class_name``, the top class's name, out."""
    tf, keras = keras_env.tensorflow(), keras_env.keras()
    names = tf.constant(list(classes))
    height, width, channels = image.shape

    def from_bytes(encoded: Any) -> dict[str, Any]:
        pixels = tf.map_fn(
            lambda one: images.prepare(tf, one, height, width, channels),
            encoded,
            fn_output_signature=tf.TensorSpec(image.shape, tf.uint8),
        )
        probabilities = model(pixels, training=False)
        top = tf.argmax(probabilities, axis=1)
        return {OUTPUT_NAME: probabilities, CLASS_OUTPUT: tf.gather(names, top)}

    archive = keras.export.ExportArchive()
    archive.track(model)
    archive.add_endpoint(
        name=SERVING_SIGNATURE,
        fn=lambda pixels: {OUTPUT_NAME: model(pixels, training=False)},
        input_signature=[tf.TensorSpec((None, *image.shape), tf.uint8, name=INPUT_NAME)],
    )
    archive.add_endpoint(
        name=BYTES_SIGNATURE,
        fn=from_bytes,
        input_signature=[tf.TensorSpec((None,), tf.string, name=BYTES_INPUT)],
    )
    archive.write_out(str(path), verbose=False)


def weights_fingerprint(model: Any) -> str:
    """sha256 over every weight's bytes: equal fingerprints mean identical models."""
    import hashlib

    digest = hashlib.sha256()
    for weight in model.get_weights():
        digest.update(weight.tobytes())
    return digest.hexdigest()
