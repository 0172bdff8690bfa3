"""horovod.tensorflow's custom-training-loop pieces on Keras 3 models (patch 0003): the
``DistributedGradientTape`` of Horovod's TF2 examples, ``PartialDistributedGradientTape`` and
``register_local_source`` (model-parallel local sources), and ``SyncBatchNormalization``. Each
takes Keras 3 variables as they come and is compared with what one process computes from every
rank's inputs."""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from tests.horovod.common import Check, Rank, assert_close, batch, flat, small_model
from tests.horovod.keras_checks import mean_gradient, steps_on_mean

STEPS, SGD_LEARNING_RATE = 3, 0.5
# SyncBatchNormalization's moments come from sums over the ranks (E[X^2] - E[X]^2), Keras's from
# two passes over one batch: equal to float32 rounding, about 1e-7 here.
BATCH_NORM_TOLERANCE = 1e-5


def _own_gradient(me: Rank, model: Any, step: int) -> list[Any]:
    """This rank's own gradient on its batch of `step` (what a plain tape gives)."""
    tf, keras = me.tf, me.keras
    x, y = batch(step, me.rank)
    with tf.GradientTape() as tape:
        value = keras.losses.SparseCategoricalCrossentropy()(y, model(x, training=True))
    return tape.gradient(value, model.trainable_variables)


def gradient_tape(me: Rank, grouped: bool = False) -> dict[str, Any]:
    """``hvd.DistributedGradientTape(tape).gradient(loss, model.trainable_variables)`` in a
    tf.function with SGD, the loop of Horovod's TF2 examples, the Keras 3 variables passed as
    they are: the first gradients are the mean of every rank's, and STEPS steps give the weights
    of SGD on the mean gradient. `grouped`: ``groups=[[both kernels]]``, which Keras 3 names
    alike ("kernel"): the grouping matches variables, not names."""
    import horovod.tensorflow as hvt

    tf, keras = me.tf, me.keras
    model = small_model(keras, seed=7)
    want_first = mean_gradient(me, model, 0)
    expected = steps_on_mean(me, model, keras.optimizers.SGD(), [SGD_LEARNING_RATE] * STEPS)
    sgd = keras.optimizers.SGD(SGD_LEARNING_RATE)
    loss = keras.losses.SparseCategoricalCrossentropy()
    kernels = [layer.kernel for layer in model.layers]
    assert len({k.name for k in kernels}) == 1, [k.name for k in kernels]
    groups = [kernels] if grouped else None

    @tf.function
    def step(x: Any, y: Any) -> Any:
        with tf.GradientTape() as tape:
            value = loss(y, model(x, training=True))
        tape = hvt.DistributedGradientTape(tape, groups=groups)
        grads = tape.gradient(value, model.trainable_variables)
        sgd.apply(grads, model.trainable_variables)
        return grads

    first = None
    for s in range(STEPS):
        grads = step(*batch(s, me.rank))
        first = first or grads
    assert_close(flat(first), flat(want_first), "the tape's gradients vs the mean of the ranks'")
    weights = flat(model.get_weights())
    assert_close(weights, flat(expected.get_weights()), "weights vs SGD on the mean")
    return {"same": {"weights": weights}}


def partial_gradient_tape(me: Rank) -> dict[str, Any]:
    """``hvd.PartialDistributedGradientTape(tape, local_layers=[first layer])`` (it registers
    the layer's Keras 3 variables with ``register_local_source``): the local layer's gradients
    are this rank's own divided by the size, the others the mean of every rank's; and
    ``get_local_and_global_gradients`` splits them so."""
    import horovod.tensorflow as hvt

    tf, keras = me.tf, me.keras
    model = small_model(keras, seed=7)
    local = model.layers[0]
    own = _own_gradient(me, model, 0)
    mean = mean_gradient(me, model, 0)
    x, y = batch(0, me.rank)
    with tf.GradientTape(persistent=True) as tape:
        value = keras.losses.SparseCategoricalCrossentropy()(y, model(x, training=True))
    tape = hvt.PartialDistributedGradientTape(tape, local_layers=[local])
    grads = tape.gradient(value, model.trainable_variables)
    local_ids = {id(v) for v in local.trainable_variables}
    for var, got, mine, avg in zip(model.trainable_variables, grads, own, mean, strict=True):
        if id(var) in local_ids:
            assert_close(got, np.asarray(mine) / me.size, f"{var.path}: own / size")
            assert not np.allclose(got, avg), f"{var.path}: averaged, though local"
        else:
            assert_close(got, avg, f"{var.path}: the mean")
    local_pairs, global_pairs = tape.get_local_and_global_gradients(
        value, model.trainable_variables
    )
    assert [id(v) for v, _ in local_pairs] == [id(v) for v in local.trainable_variables]
    assert len(global_pairs) == len(model.trainable_variables) - len(local_pairs)
    return {"same": {"global": flat(g for v, g in global_pairs)}}


def _bn_batch(rank: int) -> np.ndarray:
    """Rank `rank`'s batch for the batch-norm check: 3 + rank samples of 4 channels."""
    rng = np.random.default_rng(300 + rank)
    return rng.normal(loc=rank, scale=1 + rank, size=(3 + rank, 4)).astype(np.float32)


def sync_batch_norm(me: Rank) -> dict[str, Any]:
    """``hvd.SyncBatchNormalization`` (a Keras 3 BatchNormalization) in training, its ranks'
    batches of different sizes, called eagerly then in a tf.function: each rank's outputs, and
    the moving mean and variance, are those of Keras's BatchNormalization over all the ranks'
    samples in one batch."""
    import horovod.tensorflow as hvt

    tf, keras = me.tf, me.keras
    sync = hvt.SyncBatchNormalization(momentum=0.5)
    plain = keras.layers.BatchNormalization(momentum=0.5)
    mine = tf.constant(_bn_batch(me.rank))
    every = tf.constant(np.concatenate([_bn_batch(r) for r in range(me.size)]))
    start = sum(3 + r for r in range(me.rank))
    traced = tf.function(lambda x: sync(x, training=True))
    for call in (lambda x: sync(x, training=True), traced):
        got = call(mine)
        want = plain(every, training=True)[start : start + 3 + me.rank]
        np.testing.assert_allclose(got, want, rtol=BATCH_NORM_TOLERANCE, atol=BATCH_NORM_TOLERANCE)
    for name in ("moving_mean", "moving_variance"):
        np.testing.assert_allclose(
            getattr(sync, name).numpy(),
            getattr(plain, name).numpy(),
            rtol=BATCH_NORM_TOLERANCE,
            atol=BATCH_NORM_TOLERANCE,
            err_msg=name,
        )
    return {"same": {"moving": flat([sync.moving_mean.numpy(), sync.moving_variance.numpy()])}}


CHECKS: dict[str, Check] = {
    "gradient_tape": gradient_tape,
    "gradient_tape_groups": functools.partial(gradient_tape, grouped=True),
    "partial_gradient_tape": partial_gradient_tape,
    "sync_batch_norm": sync_batch_norm,
}
