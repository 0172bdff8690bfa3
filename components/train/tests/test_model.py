"""The ``model`` choice: the built-in models, a user's entry point, and the augmentation.

Real Keras throughout; every build is a few milliseconds to a second on CPU.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from components.common import defaults
from components.common.keras_env import keras
from components.train.model import build_model, weights_fingerprint
from components.train.preflight import PreflightError, check_model_before_launch

USER = "components.train.tests.user_model"


def _old_small_cnn(seed: int) -> Any:
    """The trainer's only model before the choice existed, copied verbatim."""
    k = keras()
    k.utils.set_random_seed(seed)
    return k.Sequential(
        [
            k.layers.Input(shape=(28, 28), name="image"),
            k.layers.Rescaling(1.0 / 255),
            k.layers.Reshape((28, 28, 1)),
            k.layers.Conv2D(16, 3, activation="relu"),
            k.layers.MaxPooling2D(),
            k.layers.Conv2D(32, 3, activation="relu"),
            k.layers.MaxPooling2D(),
            k.layers.Flatten(),
            k.layers.Dense(64, activation="relu"),
            k.layers.Dense(10, activation="softmax", name="probabilities"),
        ],
        name="mnist_cnn",
    )


def _digits(n: int = 4) -> np.ndarray:
    """`n` raw 28x28 images (float32 0..255) with a bright block off-centre."""
    x = np.zeros((n, 28, 28), np.float32)
    x[:, 6:22, 9:13] = 255.0
    x[:, 6:10, 9:20] = 200.0
    return x


def test_small_is_the_old_cnn_with_the_same_weights() -> None:
    """(mnist_advanced, the other built-in model: the next test.)"""
    assert defaults.MODELS == ("mnist_advanced", "small")
    for seed in (42, 7):
        new, old = build_model(seed, "small"), _old_small_cnn(seed)
        assert weights_fingerprint(new) == weights_fingerprint(old)
        assert (new.input_shape, new.output_shape) == ((None, 28, 28), (None, 10))
        assert new.layers[-1].name == "probabilities"
        assert new.name == "mnist_cnn" and new.count_params() == 56_714


def test_a_trainer_given_no_model_trains_the_horovod_examples_network() -> None:
    """The default reaches the network: the trainer's command line without --model or
    --augment builds mnist_advanced (1,199,882 parameters), unaugmented."""
    from components.train.config import from_argv

    config = from_argv(["--data", "/d", "--output", "/o", "--workers", "1"])
    assert (config.model, config.augment) == ("mnist_advanced", False)
    model = build_model(42, config.model, config.augment)
    assert model.count_params() == 1_199_882  # 320 + 18,496 + 1,179,776 + 1,290
    assert (model.input_shape, model.output_shape) == ((None, 28, 28), (None, 10))
    assert model.inputs[0].name == "image" and model.layers[-1].name == "probabilities"
    kinds = [type(layer).__name__ for layer in model.layers]
    assert kinds == [
        "Rescaling", "Reshape", "Conv2D", "Conv2D", "MaxPooling2D", "Dropout", "Flatten",
        "Dense", "Dropout", "Dense",
    ]  # fmt: skip
    conv1, conv2, _, drop1, _, dense1, drop2, _ = model.layers[2:]
    assert (conv1.filters, conv1.kernel_size, conv2.filters) == (32, (3, 3), 64)
    assert (drop1.rate, dense1.units, drop2.rate) == (0.25, 128, 0.5)
    probabilities = model.predict(_digits(), verbose=0)
    assert np.allclose(probabilities.sum(axis=1), 1.0, atol=1e-5)


def test_the_same_seed_builds_the_same_weights_for_every_choice() -> None:
    for choice in ("mnist_advanced", f"{USER}:build"):
        first, again, other = (weights_fingerprint(build_model(s, choice)) for s in (3, 3, 4))
        assert first == again != other


def test_a_users_entry_point_is_wrapped_into_the_trainers_contract() -> None:
    model = build_model(0, f"{USER}:build")
    assert (model.input_shape, model.output_shape) == ((None, 28, 28), (None, 10))
    assert model.inputs[0].name == "image" and model.layers[-1].name == "probabilities"
    assert model.layers[-2].name == "users_tiny_cnn"
    assert model.count_params() == model.layers[-2].count_params() == 13_610
    probabilities = model.predict(_digits(), verbose=0)
    assert probabilities.shape == (4, 10)


@pytest.mark.parametrize(
    ("choice", "message"),
    [
        ("resnet", "model must be one of the built-in models mnist_advanced, small or a Python "
         "entry point 'package.module:function' (a function (input_shape, num_classes) -> "
         "Keras model), got 'resnet'"),
        ("my.models:build:v2", "entry point 'package.module:function'"),
        ("my models:build", "got 'my models:build'"),
        ("no_such_package.models:build", "model 'no_such_package.models:build': cannot import "
         "module 'no_such_package.models' (ModuleNotFoundError: No module named "
         "'no_such_package'); is it installed or on PYTHONPATH in the trainer?"),
        (f"{USER}:nothing", f"model '{USER}:nothing': 'nothing' is not defined in module '{USER}'"),
        (f"{USER}:NOT_A_FUNCTION", "'NOT_A_FUNCTION' is not callable in module"),
        (f"{USER}:needs_three_arguments", "calling it as needs_three_arguments(input_shape=(28, "
         "28, 1), num_classes=10) raised TypeError"),
        (f"{USER}:a_layer", f"model '{USER}:a_layer' returned "
         "keras.src.layers.core.dense.Dense, not a Keras 3 model (keras.Model"),
        ("components.train.tests.keras2_model:build", "model 'components.train.tests."
         "keras2_model:build': module 'components.train.tests.keras2_model' imports tf_keras, "
         "the legacy Keras 2 package, which the trainer does not have: it runs Keras 3, so write "
         "the model with `import keras` (or `from tensorflow import keras`)"),
        (f"{USER}:five_classes", f"model '{USER}:five_classes' returns outputs of shape "
         "(None, 5); the trainer needs (None, 10): one probability per class"),
        (f"{USER}:colour_input", "does not take the trainer's images, float32 batches of shape "
         "(None, 28, 28, 1) scaled to [0, 1]: Input 0 with name 'input_layer"),
        (f"{USER}:logits", "returns outputs that are not class probabilities"),
    ],
)  # fmt: skip
def test_a_model_that_cannot_be_trained_is_named_with_the_reason(choice: str, message: str) -> None:
    with pytest.raises(PreflightError) as preflight:  # the ranks' ModelChoiceError, its words
        check_model_before_launch(choice)
    problem = str(preflight.value)
    assert message in problem and problem.startswith("kfp-horovod preflight failed: ")
    assert problem.endswith("No rank was started.")


def test_built_in_names_pass_the_preflight_without_tensorflow_a_users_is_built() -> None:
    """In a fresh process, as the launcher runs it: after each model's preflight, whether it
    passed and whether TensorFlow is loaded. Built-in names pass untouched; a user's entry
    point that works is built (so TensorFlow is loaded) and passes."""
    program = (
        "import json, sys; from components.train.preflight import check_model_before_launch; "
        "print(json.dumps([(check_model_before_launch(m), 'tensorflow' in sys.modules)[1] "
        "for m in sys.argv[1:]]))"
    )
    models = [*defaults.MODELS, f"{USER}:build"]
    out = subprocess.run(
        [sys.executable, "-c", program, *models], capture_output=True, text=True, timeout=300,
        cwd=Path(__file__).resolve().parents[3],
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.splitlines()[-1]) == [False, False, True]


# Augmentation


def test_augmentation_acts_in_training_only() -> None:
    model = build_model(5, "small", augment=True)
    assert [layer.name for layer in model.layers[2:6]] == ["rotate", "shift", "shear", "zoom"]
    x = _digits()
    inference = model(x, training=False).numpy()
    assert np.array_equal(inference, model.predict(x, verbose=0))  # predict: no augmentation
    plain = build_model(5, "small")
    assert weights_fingerprint(plain) == weights_fingerprint(model)  # no weights of its own
    assert np.allclose(inference, plain(x, training=False).numpy(), atol=1e-6)
    front = keras().Sequential(model.layers[:6])  # scaling and augmentation only
    scaled = x[..., None] / 255.0
    assert np.allclose(front(x, training=False).numpy(), scaled, atol=1e-6)
    augmented = [front(x, training=True).numpy() for _ in range(2)]
    assert not np.allclose(augmented[0], scaled, atol=1e-3)
    assert not np.allclose(augmented[0], augmented[1], atol=1e-3)  # new draws every batch


def test_the_augmentation_draws_within_the_examples_ranges() -> None:
    """256 draws of each layer stay within Horovod's example's ranges (rotation 8 degrees,
    shifts and zoom 0.08 of 28 pixels) and reach most of them."""
    rotate, shift, _, zoom = build_model(0, "small", augment=True).layers[2:6]
    batch = np.zeros((256, 28, 28, 1), np.float32)
    drawn = {
        "degrees": np.abs(rotate.get_random_transformation(batch)["angle"]),
        "pixels": np.abs(shift.get_random_transformation(batch)["translations"]),
        "zoom": np.abs(zoom.get_random_transformation(batch)["height_zoom"] - 1),
    }
    for name, bound in {"degrees": 8.0, "pixels": 0.08 * 28, "zoom": 0.08}.items():
        assert 0.8 * bound < float(np.max(drawn[name])) <= bound + 1e-5, (name, drawn[name])
    assert {rotate.fill_mode, shift.fill_mode, zoom.fill_mode} == {"nearest"}


def test_shear_is_image_data_generators_shear() -> None:
    """The shear layer's transform equals ImageDataGenerator's for the same angle."""
    import tensorflow as tf

    # ImageDataGenerator's own transform, which Keras 3 keeps beside its legacy generator.
    from keras.src.legacy.preprocessing.image import apply_affine_transform

    from components.train.augment import shear_transforms

    image = _digits(1)[0][..., None]
    for degrees in (20.0, -12.5):
        expected = apply_affine_transform(
            image, shear=degrees, row_axis=0, col_axis=1, channel_axis=2, fill_mode="nearest",
            order=1,
        )  # fmt: skip
        got = tf.raw_ops.ImageProjectiveTransformV3(
            images=image[None],
            transforms=shear_transforms(tf, tf.constant([math.radians(degrees)]), 28),
            output_shape=[28, 28], fill_value=0.0, interpolation="BILINEAR", fill_mode="NEAREST",
        )[0].numpy()  # fmt: skip
        assert np.abs(expected - image).max() > 100  # a visible shear at this angle
        assert np.allclose(got, expected, atol=1e-3)
