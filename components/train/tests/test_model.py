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
from components.common.dataset import ImageSpec
from components.common.keras_env import keras
from components.train.launcher.preflight import PreflightError, check_model_before_launch
from components.train.rank.model import build_model, export_saved_model, weights_fingerprint

USER = "components.train.tests.user_model"
DIGITS = ImageSpec(28, 28, 1)
DIGIT_CLASSES = [str(c) for c in range(10)]


def _old_small_cnn(seed: int) -> Any:
    """The project's first trainer's CNN, copied verbatim: what ``small`` must equal."""
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
    """`n` raw 28x28x1 images (uint8, as the dataset holds them) with a bright block
    off-centre."""
    x = np.zeros((n, 28, 28, 1), np.uint8)
    x[:, 6:22, 9:13] = 255
    x[:, 6:10, 9:20] = 200
    return x


def test_small_is_the_old_cnn_with_the_same_weights() -> None:
    """(mnist_advanced, the other built-in model: the next test.)"""
    assert defaults.MODELS == ("mnist_advanced", "small", "mobilenet_v3_small")
    for seed in (42, 7):
        new, old = build_model(seed, "small"), _old_small_cnn(seed)
        assert weights_fingerprint(new) == weights_fingerprint(old)
        assert (new.input_shape, new.output_shape) == ((None, 28, 28, 1), (None, 10))
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
    assert (model.input_shape, model.output_shape) == ((None, 28, 28, 1), (None, 10))
    assert model.inputs[0].name == "image" and model.layers[-1].name == "probabilities"
    kinds = [type(layer).__name__ for layer in model.layers]
    assert kinds == [
        "Rescaling",
        "Conv2D",
        "Conv2D",
        "MaxPooling2D",
        "Dropout",
        "Flatten",
        "Dense",
        "Dropout",
        "Dense",
    ]
    conv1, conv2, _, drop1, _, dense1, drop2, _ = model.layers[1:]
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
    assert (model.input_shape, model.output_shape) == ((None, 28, 28, 1), (None, 10))
    assert model.inputs[0].name == "image" and model.layers[-1].name == "probabilities"
    assert model.layers[-2].name == "users_tiny_cnn"
    assert model.count_params() == model.layers[-2].count_params() == 13_610
    probabilities = model.predict(_digits(), verbose=0)
    assert probabilities.shape == (4, 10)


@pytest.mark.parametrize(
    ("choice", "message"),
    [
        (
            "resnet",
            "model must be one of the built-in models mnist_advanced, small, "
            "mobilenet_v3_small or a Python entry point 'package.module:function' (a function "
            "(input_shape, num_classes) -> Keras model), got 'resnet'",
        ),
        ("my.models:build:v2", "entry point 'package.module:function'"),
        ("my models:build", "got 'my models:build'"),
        (
            "no_such_package.models:build",
            "model 'no_such_package.models:build': cannot import "
            "module 'no_such_package.models' (ModuleNotFoundError: No module named "
            "'no_such_package'): install it where the trainer runs, or put its folder on "
            "PYTHONPATH there",
        ),
        (f"{USER}:nothing", f"model '{USER}:nothing': 'nothing' is not defined in module '{USER}'"),
        (f"{USER}:NOT_A_FUNCTION", "'NOT_A_FUNCTION' is not callable in module"),
        (
            f"{USER}:needs_three_arguments",
            "calling it as needs_three_arguments(input_shape=(28, "
            "28, 1), num_classes=10) raised TypeError",
        ),
        (
            f"{USER}:a_layer",
            f"model '{USER}:a_layer' returned "
            "keras.src.layers.core.dense.Dense, not a Keras 3 model (keras.Model",
        ),
        (
            "components.train.tests.keras2_model:build",
            "model 'components.train.tests.keras2_model:build': module "
            "'components.train.tests.keras2_model' imports tf_keras, the legacy Keras 2 package, "
            "which the trainer does not have: it runs Keras 3, so write the model with "
            "`import keras` (or `from tensorflow import keras`)",
        ),
        (
            f"{USER}:five_classes",
            f"model '{USER}:five_classes' returns outputs of shape "
            "(None, 5); the trainer needs (None, 10): one probability per class",
        ),
        (
            f"{USER}:colour_input",
            "does not take the trainer's images, float32 batches of shape "
            "(None, 28, 28, 1) scaled to [0, 1]: Input 0 with name 'input_layer",
        ),
        (f"{USER}:logits", "returns outputs that are not class probabilities"),
    ],
)
def test_a_model_that_cannot_be_trained_is_named_with_the_reason(choice: str, message: str) -> None:
    with pytest.raises(PreflightError) as preflight:  # the ranks' ModelChoiceError, its words
        check_model_before_launch(choice, DIGITS, 10)
    problem = str(preflight.value)
    assert message in problem and problem.startswith("kfp-horovod preflight failed: ")
    assert problem.endswith("No rank was started.")
    assert "?." not in problem and ".." not in problem  # it reads as one sentence after another


def test_built_in_names_pass_the_preflight_without_tensorflow_a_users_is_built() -> None:
    """In a fresh process, as the launcher runs it before data prep (no dataset yet): after each
    model's preflight, whether it passed and whether TensorFlow is loaded. Built-in names pass
    untouched; a user's entry point that works is imported (so TensorFlow is loaded) and
    passes."""
    program = (
        "import json, sys; "
        "from components.train.launcher.preflight import check_model_before_launch; "
        "print(json.dumps([(check_model_before_launch(m), 'tensorflow' in sys.modules)[1] "
        "for m in sys.argv[1:]]))"
    )
    models = [*defaults.MODELS, f"{USER}:build"]
    out = subprocess.run(
        [sys.executable, "-c", program, *models],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=Path(__file__).resolve().parents[3],
    )
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.splitlines()[-1]) == [False, False, False, True]


# Augmentation


def test_augmentation_acts_in_training_only() -> None:
    model = build_model(5, "small", augment=True)
    assert [layer.name for layer in model.layers[1:5]] == ["rotate", "shift", "shear", "zoom"]
    x = _digits()
    inference = model(x, training=False).numpy()
    assert np.array_equal(inference, model.predict(x, verbose=0))  # predict: no augmentation
    plain = build_model(5, "small")
    assert weights_fingerprint(plain) == weights_fingerprint(model)  # no weights of its own
    assert np.allclose(inference, plain(x, training=False).numpy(), atol=1e-6)
    front = keras().Sequential([keras().Input((28, 28, 1)), *model.layers[:5]])  # scaling, aug.
    scaled = x / 255.0
    assert np.allclose(front(x, training=False).numpy(), scaled, atol=1e-6)


def _ink_centre_and_tilt(images: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each image's total ink, its centre of mass (row, column) in pixels, and the tilt of its
    long axis from the vertical, in degrees."""
    rows, cols = np.indices(images.shape[1:3])
    ink = images.sum(axis=(1, 2))

    def mean(of: np.ndarray) -> np.ndarray:
        return (images * of).sum(axis=(1, 2)) / ink

    r, c = mean(rows), mean(cols)
    rr, cc = mean(rows**2) - r**2, mean(cols**2) - c**2
    rc = mean(rows * cols) - r * c
    return ink, np.stack([r, c], axis=1), np.degrees(0.5 * np.arctan2(2 * rc, rr - cc))


def test_training_sees_each_digit_moved_within_the_examples_bounds() -> None:
    """What ``fit`` feeds the network, 256 augmented copies of a digit and of a vertical bar:
    each moved, no further than Horovod's example allows, and the draws reach most of it. The
    digit's centre of mass moves at most a shift of 0.08 x 28 pixels a side, enlarged by the
    zoom, plus what rotation (8 degrees), shear (0.3) and zoom (0.08) make of its distance from
    the image's centre; its ink changes by the zoom's area alone (no pixel lost at the edges).
    The bar tilts by the rotation and the shear, which the zoom's two scales can steepen."""
    layers = build_model(0, "small", augment=True).layers[:5]
    front = keras().Sequential([keras().Input((28, 28, 1)), *layers])
    bar = np.zeros((1, 28, 28, 1), np.uint8)
    bar[:, 4:24, 13:15] = 255
    x = np.repeat(np.concatenate([_digits(1), bar]), 256, axis=0)
    inks, centres, tilts = _ink_centre_and_tilt(front(x, training=True).numpy()[..., 0])
    (ink, _), (start, _), _ = _ink_centre_and_tilt(x[::256, ..., 0] / 255.0)
    shift, smallest, largest = 0.08 * 28, 1 / 1.08, 1 / 0.92  # pixels a side; zoom's scales
    linear = largest * (1 + math.radians(0.3)) * (1 + 2 * math.sin(math.radians(4))) - 1
    bound = largest * shift * math.sqrt(2) + linear * np.hypot(*(start - 13.5)) + 0.25
    moved = np.hypot(*(centres[:256] - start).T)
    assert moved.max() <= bound, (moved.max(), bound)
    assert np.abs(centres[:256] - start).max(axis=0).min() > 0.8 * shift  # on each axis
    kept = inks[:256] / ink  # the zoom's area change alone
    assert smallest**2 - 0.02 <= kept.min() and kept.max() <= largest**2 + 0.02, kept
    steepest = math.degrees(math.atan(math.tan(math.radians(8 + 0.3)) * largest / smallest))
    tilt = np.abs(tilts[256:])
    assert 0.75 * 8 < tilt.max() <= steepest + 0.3, (tilt.max(), steepest)
    assert len({tuple(c) for c in np.round(centres, 2)}) > 500  # a new draw for every image


def test_an_augmented_models_saved_model_serves_as_the_plain_one(tmp_path: Path) -> None:
    """The served contract is the plain model's: its SavedModel loads in a fresh process
    without the augmentation's code, takes the same raw ``image`` (n, 28, 28, 1) and returns
    the plain model's probabilities for the same weights, the same on every call."""
    model = build_model(5, "small", augment=True)
    export_saved_model(model, tmp_path / "model", DIGITS, DIGIT_CLASSES)
    np.save(tmp_path / "x.npy", _digits())
    program = (
        "import json, sys, numpy as np, tensorflow as tf; "
        "sig = tf.saved_model.load(sys.argv[1]).signatures['serving_default']; "
        "x = tf.constant(np.load(sys.argv[2])); "
        "(spec,) = sig.structured_input_signature[1].values(); "
        "p = [sig(image=x)['probabilities'].numpy().tolist() for _ in range(2)]; "
        "print(json.dumps([spec.name, spec.shape.as_list(), spec.dtype.name, p, "
        "'components.train.rank.augment' in sys.modules]))"
    )
    out = subprocess.run(
        [sys.executable, "-c", program, str(tmp_path / "model"), str(tmp_path / "x.npy")],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=Path(__file__).resolve().parents[3],
    )
    assert out.returncode == 0, out.stderr
    name, shape, dtype, (served, again), augment = json.loads(out.stdout.splitlines()[-1])
    assert (name, shape, dtype, augment) == ("image", [None, 28, 28, 1], "uint8", False)
    plain = build_model(5, "small")(_digits(), training=False).numpy()
    assert served == again and np.allclose(served, plain, atol=1e-6)


def test_shear_is_image_data_generators_shear() -> None:
    """The shear layer's transform equals ImageDataGenerator's for the same angle."""
    import tensorflow as tf

    # ImageDataGenerator's own transform, which Keras 3 keeps beside its legacy generator.
    from keras.src.legacy.preprocessing.image import apply_affine_transform

    from components.train.rank.augment import shear_transforms

    image = _digits(1)[0].astype(np.float32)
    for degrees in (20.0, -12.5):
        expected = apply_affine_transform(
            image,
            shear=degrees,
            row_axis=0,
            col_axis=1,
            channel_axis=2,
            fill_mode="nearest",
            order=1,
        )
        got = tf.raw_ops.ImageProjectiveTransformV3(
            images=image[None],
            transforms=shear_transforms(tf, tf.constant([math.radians(degrees)]), 28),
            output_shape=[28, 28],
            fill_value=0.0,
            interpolation="BILINEAR",
            fill_mode="NEAREST",
        )[0].numpy()
        assert np.abs(expected - image).max() > 100  # a visible shear at this angle
        assert np.allclose(got, expected, atol=1e-3)


@pytest.mark.parametrize(
    ("choice", "shape", "classes"),
    [
        ("mnist_advanced", (25, 25, 1), 2),
        ("small", (40, 32, 3), 5),
        ("mobilenet_v3_small", (64, 64, 3), 7),
        ("mobilenet_v3_small", (32, 32, 1), 3),
        (f"{USER}:build", (12, 12, 3), 4),
    ],
)
def test_every_model_takes_the_datasets_shape_and_classes(
    choice: str, shape: tuple[int, int, int], classes: int
) -> None:
    """A built-in or a user's model, for uint8 images of any size and colour it can take and
    any number of classes: the user's function is called with the dataset's values."""
    model = build_model(0, choice, shape=shape, num_classes=classes)
    assert (model.input_shape, model.output_shape) == ((None, *shape), (None, classes))
    images = np.random.default_rng(0).integers(0, 256, (3, *shape), np.uint8)
    rows = model(images, training=False).numpy()
    assert np.allclose(rows.sum(axis=1), 1.0, atol=1e-5)
    check_model_before_launch(choice, ImageSpec(*shape), classes)  # the launcher agrees


@pytest.mark.parametrize(
    ("choice", "side", "smallest"),
    [("small", 9, 10), ("mnist_advanced", 5, 6), ("mobilenet_v3_small", 28, 32)],
)
def test_a_built_in_model_refuses_images_too_small_for_it_before_tensorflow(
    choice: str, side: int, smallest: int
) -> None:
    with pytest.raises(PreflightError) as preflight:
        check_model_before_launch(choice, ImageSpec(side, side, 1), 10)
    assert (
        f"model {choice!r} takes images of {smallest}x{smallest} pixels or more, and the "
        f"dataset's are {side}x{side}: set image_size to {smallest} or more"
    ) in str(preflight.value)


def test_serving_bytes_decodes_and_resizes_as_data_prep_does(tmp_path: Path) -> None:
    """Encoded files of any size and colour, given to ``serving_bytes``, meet the network as
    data prep prepared them (`components.common.images`): the same probabilities as
    ``serving_default`` on the prepared pixels, and the top class's name."""
    import tensorflow as tf

    from components.common import images
    from components.common.tests.datasets import save_image

    spec, classes = ImageSpec(16, 16, 3), ["cat", "dog", "emu"]
    model = build_model(1, "small", shape=spec.shape, num_classes=3)
    export_saved_model(model, tmp_path / "model", spec, classes)
    rng = np.random.default_rng(2)
    files = [
        save_image(tmp_path / "a.jpg", rng.integers(0, 256, (30, 20, 3), np.uint8)),
        save_image(tmp_path / "b.png", rng.integers(0, 256, (16, 16), np.uint8)),
        save_image(tmp_path / "c.gif", rng.integers(0, 256, (9, 40, 3), np.uint8)),
    ]
    encoded = [f.read_bytes() for f in files]
    loaded = tf.saved_model.load(str(tmp_path / "model"))
    out = loaded.signatures["serving_bytes"](image_bytes=tf.constant(encoded))
    prepared = np.stack([images.prepare(tf, e, 16, 16, 3).numpy() for e in encoded])
    plain = loaded.signatures["serving_default"](image=tf.constant(prepared))["probabilities"]
    np.testing.assert_allclose(out["probabilities"].numpy(), plain.numpy(), atol=1e-6)
    names = [n.decode() for n in out["class_name"].numpy()]
    assert names == [classes[k] for k in plain.numpy().argmax(axis=1)]


def test_under_mixed_precision_the_probabilities_stay_float32(tmp_path: Path) -> None:
    """The trainer's ``mixed_precision`` policy computes the network in float16 and its output
    layer in float32 (the softmax's sums), for the built-ins and a user's model alike; the
    SavedModel returns float32 probabilities."""
    import tensorflow as tf

    k = keras()
    k.mixed_precision.set_global_policy("mixed_float16")
    try:
        for choice in ("small", f"{USER}:build"):
            model = build_model(0, choice)
            assert model.layers[-2].compute_dtype == "float16" or choice != "small"
            assert model(_digits(), training=False).dtype == tf.float32
        export_saved_model(model, tmp_path / "m", DIGITS, DIGIT_CLASSES)
    finally:
        k.mixed_precision.set_global_policy("float32")
    served = tf.saved_model.load(str(tmp_path / "m")).signatures["serving_default"]
    assert served(image=tf.constant(_digits()))["probabilities"].dtype == tf.float32
