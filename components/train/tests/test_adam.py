"""`FusedAdam`: Keras 3's Adam step, through TensorFlow's fused kernel, to the last bit Keras's
own arithmetic gives (real Keras and TensorFlow, on CPU)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from components.common.keras_env import keras, tensorflow
from components.train.rank.adam import adam_moments, fused_adam

SETTINGS = {"learning_rate": 0.01, "beta_1": 0.85, "beta_2": 0.99, "epsilon": 1e-6}


def _steps(optimizer: Any, grads: list[list[Any]], rates: list[float], graph: bool) -> Any:
    """`optimizer`'s variables after applying each step's `grads` at its learning rate (changed
    between steps as Horovod's warmup callback does), in a tf.function when `graph`."""
    tf, k = tensorflow(), keras()
    rng = np.random.default_rng(0)
    weights = [k.Variable(rng.normal(size=g.shape).astype("float32")) for g in grads[0]]
    optimizer.build(weights)

    def apply(step: list[Any]) -> None:
        optimizer.apply(step, weights)

    for step, rate in zip(grads, rates, strict=True):
        optimizer.learning_rate = rate
        (tf.function(apply) if graph else apply)(step)
    return [w.numpy() for w in weights], [v.numpy() for v in optimizer.variables]


@pytest.mark.parametrize("graph", [False, True], ids=["eager", "tf.function"])
def test_the_fused_step_is_keras_adams_step(graph: bool) -> None:
    rng = np.random.default_rng(1)
    shapes = [(30, 20), (20,), (3, 3, 1, 4)]
    grads = [[rng.normal(size=s).astype("float32") for s in shapes] for _ in range(6)]
    rates = [0.01, 0.01, 0.02, 0.005, 0.005, 0.01]
    fused = _steps(fused_adam(**SETTINGS), grads, rates, graph)
    plain = _steps(keras().optimizers.Adam(**SETTINGS), grads, rates, graph)
    for got, want in zip([*fused[0], *fused[1]], [*plain[0], *plain[1]], strict=True):
        np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-7)
    start = np.random.default_rng(0).normal(size=shapes[0]).astype("float32")  # `_steps`'s
    assert np.abs(fused[0][0] - start).min() > 1e-6  # every weight moved


def _ops_of_a_step(optimizer: Any) -> set[str]:
    tf, k = tensorflow(), keras()
    weights = [k.Variable(np.ones((4, 3), "float32"))]
    optimizer.build(weights)
    traced = tf.function(lambda g: optimizer.apply(g, weights)).get_concrete_function(
        [tf.ones((4, 3))]
    )
    ops = {node.op for node in traced.graph.as_graph_def().node}
    for function in traced.graph.as_graph_def().library.function:
        ops |= {node.op for node in function.node_def}
    return ops


def test_the_step_is_tensorflows_fused_kernel() -> None:
    assert "ResourceApplyAdam" in _ops_of_a_step(fused_adam(**SETTINGS))
    assert "ResourceApplyAdam" not in _ops_of_a_step(keras().optimizers.Adam(**SETTINGS))


def test_amsgrad_and_sparse_gradients_get_keras_own_step() -> None:
    tf = tensorflow()
    rng = np.random.default_rng(2)
    dense = [[rng.normal(size=(5, 2)).astype("float32")] for _ in range(3)]
    settings = {**SETTINGS, "amsgrad": True}
    fused = _steps(fused_adam(**settings), dense, [0.01] * 3, graph=True)
    plain = _steps(keras().optimizers.Adam(**settings), dense, [0.01] * 3, graph=True)
    np.testing.assert_array_equal(fused[0][0], plain[0][0])
    rows = [
        tf.IndexedSlices(tf.constant(g[0][:2]), tf.constant([1, 3]), tf.constant([5, 2]))
        for g in dense
    ]
    fused = _steps(fused_adam(**SETTINGS), [[r] for r in rows], [0.01] * 3, graph=False)
    plain = _steps(keras().optimizers.Adam(**SETTINGS), [[r] for r in rows], [0.01] * 3, False)
    np.testing.assert_array_equal(fused[0][0], plain[0][0])


def test_the_moments_fused_adam_reads_are_keras_adams() -> None:
    """`adam_moments` reads Keras's private slots (the project's one such read): after one step
    of Keras's own Adam they are its variables holding (1 - beta_1) g and (1 - beta_2) g^2 of
    each weight's gradient g. Fails the day Keras renames or reorders them."""
    k = keras()
    rng = np.random.default_rng(3)
    weights = [k.Variable(rng.normal(size=s).astype("float32")) for s in [(4, 3), (3,), (2,)]]
    grads = [rng.normal(size=w.shape).astype("float32") for w in weights]
    optimizer = k.optimizers.Adam(**SETTINGS)
    optimizer.apply(grads, weights)
    held = {id(v) for v in optimizer.variables}
    for weight, g in zip(weights, grads, strict=True):
        momentum, velocity = adam_moments(optimizer, weight)
        assert {id(momentum), id(velocity)} <= held
        np.testing.assert_allclose(momentum.numpy(), (1 - SETTINGS["beta_1"]) * g, rtol=1e-6)
        np.testing.assert_allclose(velocity.numpy(), (1 - SETTINGS["beta_2"]) * g**2, rtol=1e-5)
