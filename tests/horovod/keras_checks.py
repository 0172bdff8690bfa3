"""Horovod's Keras pieces as the trainer uses them (components/train/trainer.py): the
DistributedOptimizer around tf-keras' legacy Adam, and the broadcast, metric-average and
learning-rate warmup callbacks, in ``model.fit`` on each rank's own data."""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from tests.horovod.common import (
    TOLERANCE,
    Rank,
    batch,
    compile_distributed,
    dataset,
    flat,
    recorder,
    small_model,
)

STEPS, LEARNING_RATE = 3, 0.01
WARMUP_LR, WARMUP_EPOCHS, WARMUP_STEPS = 0.004, 2, 3


def _averaged_gradient_steps(me: Rank, model: Any) -> list[float]:
    """What one process computes from the averaged gradient: `model`'s initial weights, then
    STEPS steps of plain Adam, each on the mean of every rank's gradient on its own batch."""
    tf, keras = me.tf, me.keras
    single = keras.models.clone_model(model)
    single.set_weights(model.get_weights())
    adam = keras.optimizers.legacy.Adam(learning_rate=LEARNING_RATE)
    loss = keras.losses.SparseCategoricalCrossentropy()
    for step in range(STEPS):
        grads = []
        for rank in range(me.size):
            x, y = batch(step, rank)
            with tf.GradientTape() as tape:
                value = loss(y, single(x, training=True))
            grads.append(tape.gradient(value, single.trainable_variables))
        mean = [tf.add_n(list(g)) / me.size for g in zip(*grads, strict=True)]
        adam.apply_gradients(zip(mean, single.trainable_variables, strict=True))
    return flat(single.get_weights())


def distributed_optimizer(me: Rank, **options: Any) -> dict[str, Any]:
    """``hvd.DistributedOptimizer(Adam, **options)`` (trainer.build_or_resume; ``groups=2``:
    grouped allreduce, bench/variants.py's ``--groups``): STEPS steps on different data per
    rank give identical weights, those of Adam on the averaged gradient."""
    model = small_model(me.keras, seed=7)  # the same initial weights on every rank
    initial = flat(model.get_weights())
    expected = _averaged_gradient_steps(me, model)
    optimizer = compile_distributed(me, model, LEARNING_RATE, **options)
    model.fit(dataset(me, STEPS), epochs=1, steps_per_epoch=STEPS, verbose=0)
    weights = flat(model.get_weights())
    assert weights != initial, "the steps changed no weight"
    np.testing.assert_allclose(weights, expected, **TOLERANCE, err_msg="vs Adam on the mean")
    assert int(optimizer.iterations.numpy()) == STEPS, optimizer.iterations
    return {"same": {"weights": weights}}


def broadcast_callback(me: Rank) -> dict[str, Any]:
    """BroadcastGlobalVariablesCallback(0) (trainer.callbacks): ranks that start from
    different weights hold rank 0's after the first step. The learning rate is 0, so a step
    leaves the weights as they are: every rank must end with rank 0's initial weights."""
    initial = [flat(small_model(me.keras, seed=100 + r).get_weights()) for r in range(me.size)]
    model = small_model(me.keras, seed=100 + me.rank)
    optimizer = compile_distributed(me, model, 0.0)
    callbacks = [me.hvd.callbacks.BroadcastGlobalVariablesCallback(0)]
    model.fit(dataset(me, 2), epochs=1, steps_per_epoch=2, callbacks=callbacks, verbose=0)
    assert initial[0] != initial[1], "the ranks must start apart"
    assert flat(model.get_weights()) == initial[0], "this rank does not hold rank 0's weights"
    assert int(optimizer.iterations.numpy()) == 2, optimizer.iterations
    return {"same": {"optimizer_state": flat(v.numpy() for v in optimizer.variables())}}


def metric_average_callback(me: Rank) -> dict[str, Any]:
    """MetricAverageCallback (trainer.callbacks): the callbacks after it see the epoch's
    metrics averaged over the ranks (the test compares them with the ranks' own); those before
    it see this rank's own."""
    hvd = me.hvd
    model = small_model(me.keras, seed=7)
    compile_distributed(me, model, LEARNING_RATE)
    own: list[dict[str, float]] = []
    averaged: list[dict[str, float]] = []
    callbacks = [
        hvd.callbacks.BroadcastGlobalVariablesCallback(0),
        recorder(me.keras, own),
        hvd.callbacks.MetricAverageCallback(),
        recorder(me.keras, averaged),
    ]
    model.fit(dataset(me, 2), epochs=2, steps_per_epoch=2, callbacks=callbacks, verbose=0)
    assert [set(logs) for logs in averaged] == [{"loss", "accuracy"}] * 2, averaged
    return {"own": own, "same": {"averaged": averaged}}


def warmup_lr(epoch: int, step: int, size: int) -> float:
    """The warmup Horovod documents: from lr / size to lr over the warmup epochs, linear in
    the fraction of epochs done after each step; lr itself once the warmup is over."""
    if epoch >= WARMUP_EPOCHS:
        return WARMUP_LR
    done = epoch + (step + 1) / WARMUP_STEPS
    return WARMUP_LR / size * (1 + done * (size - 1) / WARMUP_EPOCHS)


def lr_warmup_callback(me: Rank) -> dict[str, Any]:
    """LearningRateWarmupCallback as trainer.callbacks sets it up (after the metric average):
    the learning rate every step uses, and the ``lr`` each epoch logs, follow `warmup_lr`."""
    hvd, keras = me.hvd, me.keras
    model = small_model(keras, seed=7)
    compile_distributed(me, model, WARMUP_LR)
    used: list[float] = []
    logged: list[dict[str, float]] = []
    callbacks = [
        hvd.callbacks.BroadcastGlobalVariablesCallback(0),
        hvd.callbacks.MetricAverageCallback(),
        hvd.callbacks.LearningRateWarmupCallback(
            initial_lr=WARMUP_LR, warmup_epochs=WARMUP_EPOCHS, steps_per_epoch=WARMUP_STEPS
        ),
        keras.callbacks.LambdaCallback(
            on_batch_begin=lambda step, logs: used.append(float(model.optimizer.lr.numpy()))
        ),
        recorder(keras, logged),
    ]
    epochs, steps = WARMUP_EPOCHS + 1, WARMUP_STEPS
    model.fit(
        dataset(me, steps), epochs=epochs, steps_per_epoch=steps, callbacks=callbacks, verbose=0
    )
    want = [warmup_lr(e, s, me.size) for e in range(epochs) for s in range(steps)]
    np.testing.assert_allclose(used, want, **TOLERANCE, err_msg="the lr of each step")
    epoch_lr = [e.get("lr") for e in logged]
    want = [warmup_lr(e, steps - 1, me.size) for e in range(epochs)]
    np.testing.assert_allclose(epoch_lr, want, **TOLERANCE, err_msg="the lr logged per epoch")
    return {"same": {"step_lr": used, "epoch_lr": epoch_lr}}


CHECKS = {
    "distributed_optimizer": distributed_optimizer,
    "distributed_optimizer_groups": functools.partial(distributed_optimizer, groups=2),
    "broadcast_callback": broadcast_callback,
    "metric_average_callback": metric_average_callback,
    "lr_warmup_callback": lr_warmup_callback,
}
