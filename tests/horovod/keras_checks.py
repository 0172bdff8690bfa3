"""Horovod's Keras pieces as the trainer uses them (components/train/trainer.py): the
DistributedOptimizer around tf-keras' legacy Adam, and the broadcast, metric-average and
learning-rate warmup callbacks, in ``model.fit`` on each rank's own data."""

from __future__ import annotations

import functools
from typing import Any

from tests.horovod.common import (
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
    return {
        "initial": initial,
        "weights": flat(model.get_weights()),
        "expected": expected,
        "iterations": int(optimizer.iterations.numpy()),
    }


def broadcast_callback(me: Rank) -> dict[str, Any]:
    """BroadcastGlobalVariablesCallback(0) (trainer.callbacks): ranks that start from
    different weights hold rank 0's after the first step. The learning rate is 0, so a step
    leaves the weights as they are: every rank must end with rank 0's initial weights."""
    hvd = me.hvd
    model = small_model(me.keras, seed=100 + me.rank)  # different on every rank
    initial = flat(model.get_weights())
    optimizer = compile_distributed(me, model, 0.0)
    callbacks = [hvd.callbacks.BroadcastGlobalVariablesCallback(0)]
    model.fit(dataset(me, 2), epochs=1, steps_per_epoch=2, callbacks=callbacks, verbose=0)
    return {
        "initial": initial,
        "weights": flat(model.get_weights()),
        "optimizer_state": flat(v.numpy() for v in optimizer.variables()),
        "iterations": int(optimizer.iterations.numpy()),
    }


def metric_average_callback(me: Rank) -> dict[str, Any]:
    """MetricAverageCallback (trainer.callbacks): the callbacks after it see the epoch's
    metrics averaged over the ranks; those before it see this rank's own."""
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
    return {"own": own, "averaged": averaged}


def lr_warmup_callback(me: Rank) -> dict[str, Any]:
    """LearningRateWarmupCallback as trainer.callbacks sets it up (after the metric
    average): the learning rate every step used, and the ``lr`` each epoch logged."""
    hvd, keras = me.hvd, me.keras
    model = small_model(keras, seed=7)
    compile_distributed(me, model, WARMUP_LR)
    used: list[float] = []

    class StepLR(keras.callbacks.Callback):  # type: ignore[misc, name-defined]
        def on_train_batch_begin(self, step: int, logs: Any = None) -> None:
            used.append(float(keras.backend.get_value(self.model.optimizer.lr)))

    logged: list[dict[str, float]] = []
    callbacks = [
        hvd.callbacks.BroadcastGlobalVariablesCallback(0),
        hvd.callbacks.MetricAverageCallback(),
        hvd.callbacks.LearningRateWarmupCallback(
            initial_lr=WARMUP_LR, warmup_epochs=WARMUP_EPOCHS, steps_per_epoch=WARMUP_STEPS
        ),
        StepLR(),
        recorder(keras, logged),
    ]
    epochs = WARMUP_EPOCHS + 1
    model.fit(
        dataset(me, WARMUP_STEPS), epochs=epochs, steps_per_epoch=WARMUP_STEPS,
        callbacks=callbacks, verbose=0,
    )  # fmt: skip
    return {"step_lr": used, "epoch_lr": [e.get("lr") for e in logged], "size": me.size}


CHECKS = {
    "distributed_optimizer": distributed_optimizer,
    "distributed_optimizer_groups": functools.partial(distributed_optimizer, groups=2),
    "broadcast_callback": broadcast_callback,
    "metric_average_callback": metric_average_callback,
    "lr_warmup_callback": lr_warmup_callback,
}
