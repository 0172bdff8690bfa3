"""The trainer's models: raw 28x28 uint8 digits in (input ``image``), class probabilities out
(output ``probabilities``), the scaling to [0, 1] inside. The ``model`` parameter picks one:

- ``mnist_advanced`` (the default): the network of Horovod's ``keras_mnist_advanced.py``.
- ``small``: the project's first CNN, the same weights for the same seed as before the choice.
- ``package.module:function``: the user's own, called as ``function((28, 28, 1), 10)``: a Keras 3
  model (``import keras``: layers, ``keras.ops``, custom layers, functional or Sequential) from
  float32 images scaled to [0, 1] (as the Horovod example feeds them) to softmax probabilities,
  wrapped between the ``image`` input, the scaling and ``probabilities``. A module that brings in
  tf-keras (Keras 2) is refused by name.

`build_model` seeds every random generator with the run's seed first, so every rank builds the
same initial weights.
"""

from __future__ import annotations

import importlib
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from components.common import keras_env
from components.common.declare import model_problem
from components.common.defaults import AUGMENT, IMAGE_SHAPE, MODEL, MODELS, NUM_CLASSES
from components.common.failure import InputError
from components.common.model_files import SERVING_SIGNATURE

# What the user's function gets: one channel of 28x28, ten classes.
INPUT_SHAPE = (*IMAGE_SHAPE, 1)
INPUT_NAME, OUTPUT_NAME = "image", "probabilities"


class ModelChoiceError(InputError):
    """The ``model`` parameter names no model the trainer can build."""


def _small(keras: Any) -> list[Any]:
    return [
        keras.layers.Conv2D(16, 3, activation="relu"),
        keras.layers.MaxPooling2D(),
        keras.layers.Conv2D(32, 3, activation="relu"),
        keras.layers.MaxPooling2D(),
        keras.layers.Flatten(),
        keras.layers.Dense(64, activation="relu"),
        keras.layers.Dense(NUM_CLASSES, activation="softmax", name=OUTPUT_NAME),
    ]


def _mnist_advanced(keras: Any) -> list[Any]:
    return [
        keras.layers.Conv2D(32, kernel_size=(3, 3), activation="relu"),
        keras.layers.Conv2D(64, (3, 3), activation="relu"),
        keras.layers.MaxPooling2D(pool_size=(2, 2)),
        keras.layers.Dropout(0.25),
        keras.layers.Flatten(),
        keras.layers.Dense(128, activation="relu"),
        keras.layers.Dropout(0.5),
        keras.layers.Dense(NUM_CLASSES, activation="softmax", name=OUTPUT_NAME),
    ]


# Built-in model -> (the Keras model's name, its layers after the scaling). Names: MODELS.
BUILT_IN: dict[str, tuple[str, Callable[[Any], list[Any]]]] = {
    "mnist_advanced": ("mnist_advanced", _mnist_advanced),
    "small": ("mnist_cnn", _small),
}
assert tuple(BUILT_IN) == MODELS, "defaults.MODELS names the built-in models"


def build_model(seed: int, model: str = MODEL, augment: bool = AUGMENT) -> Any:
    """The Keras model `model`, initialised identically on every rank for a given `seed`
    (ModelChoiceError if a user's model does not import, build or fit)."""
    try:
        keras = keras_env.keras()
    except keras_env.KerasSetupError as exc:  # the backend is not TensorFlow
        raise ModelChoiceError(str(exc)) from exc
    keras.utils.set_random_seed(seed)
    front = [
        keras.layers.Input(shape=IMAGE_SHAPE, name=INPUT_NAME),
        keras.layers.Rescaling(1.0 / 255),
        keras.layers.Reshape(INPUT_SHAPE),
    ]
    if model in BUILT_IN:
        name, layers = BUILT_IN[model]
        built = keras.Sequential([*front, *layers(keras)], name=name)
    else:
        built = _user_model(keras, model, front)
    return _with_augmentation(keras, built) if augment else built


def _with_augmentation(keras: Any, built: Any) -> Any:
    """`built` with the augmentation layers after its scaling and reshaping. Its layers are reused
    as built: augmentation layers made first would shift the weights' random draws."""
    from components.train.augment import augmentation_layers

    image = keras.layers.Input(shape=IMAGE_SHAPE, name=INPUT_NAME)
    layers = [image, *built.layers[:2], *augmentation_layers(keras), *built.layers[2:]]
    return keras.Sequential(layers, name=built.name)


def _user_model(keras: Any, model: str, front: list[Any]) -> Any:
    """``function((28, 28, 1), 10)`` of ``package.module:function`` between `front` and
    ``probabilities``, or ModelChoiceError saying why it does not fit."""
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
    try:
        built = function(INPUT_SHAPE, NUM_CLASSES)
    except Exception as exc:
        raise ModelChoiceError(
            f"model {model!r}: calling it as {model.split(':')[1]}(input_shape={INPUT_SHAPE}, "
            f"num_classes={NUM_CLASSES}) raised {type(exc).__name__}: {exc}"
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
            [*front, built, keras.layers.Activation("linear", name=OUTPUT_NAME)], name="user_model"
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
            f"(None, {', '.join(map(str, INPUT_SHAPE))}) scaled to [0, 1]: {reason}"
        ) from exc
    got = wrapped.output_shape
    if not isinstance(got, tuple) or tuple(got) != (None, NUM_CLASSES):
        raise ModelChoiceError(
            f"model {model!r} returns outputs of shape {got}; the trainer needs "
            f"(None, {NUM_CLASSES}): one probability per class"
        )
    return wrapped


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


def export_saved_model(model: Any, path: Path) -> None:
    """`model` as a SavedModel whose ``serving_default`` signature takes raw ``(n, 28, 28)``
    digits as ``image`` and returns ``probabilities`` (the contract evaluate, register, serving
    and TF Serving read), through Keras 3's own `ExportArchive`."""
    tf, keras = keras_env.tensorflow(), keras_env.keras()
    archive = keras.export.ExportArchive()
    archive.track(model)
    archive.add_endpoint(
        name=SERVING_SIGNATURE,
        fn=lambda image: {OUTPUT_NAME: model(image, training=False)},
        input_signature=[tf.TensorSpec((None, *IMAGE_SHAPE), tf.float32, name=INPUT_NAME)],
    )
    archive.write_out(str(path), verbose=False)


def weights_fingerprint(model: Any) -> str:
    """sha256 over every weight's bytes: equal fingerprints mean identical models."""
    import hashlib

    digest = hashlib.sha256()
    for weight in model.get_weights():
        digest.update(weight.tobytes())
    return digest.hexdigest()
