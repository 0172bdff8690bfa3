"""Horovod's metric-average and learning-rate warmup callbacks on Keras 3, as
components/train/rank/trainer.py's ``callbacks`` sets them up, in ``model.fit`` on each rank's own
data."""

from __future__ import annotations

from typing import Any

from tests.horovod.common import (
    Check,
    Rank,
    assert_close,
    compile_distributed,
    dataset,
    flat,
    recorder,
    small_model,
)
from tests.horovod.keras_checks import steps_on_mean

LEARNING_RATE = 0.01
WARMUP_LR, WARMUP_EPOCHS, WARMUP_STEPS = 0.004, 2, 3


def metric_average_callback(me: Rank) -> dict[str, Any]:
    """MetricAverageCallback (trainer.callbacks): the callbacks after it see the epoch's
    metrics averaged over the ranks (the test compares them with the ranks' own); those before
    it see this rank's own."""
    hvd, keras = me.hvd, me.keras
    model = small_model(keras, seed=7)
    compile_distributed(me, model, keras.optimizers.Adam(LEARNING_RATE))
    own: list[dict[str, float]] = []
    averaged: list[dict[str, float]] = []
    callbacks = [
        hvd.callbacks.BroadcastGlobalVariablesCallback(0),
        recorder(keras, own),
        hvd.callbacks.MetricAverageCallback(),
        recorder(keras, averaged),
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
    the learning rate every step uses (Keras 3's ``optimizer.learning_rate``), and the ``lr``
    each epoch logs, follow `warmup_lr`; and the steps took them: the weights are those of
    plain Adam on the averaged gradient at `warmup_lr`'s rates."""
    hvd, keras = me.hvd, me.keras
    model = small_model(keras, seed=7)
    epochs, steps = WARMUP_EPOCHS + 1, WARMUP_STEPS
    rates = [warmup_lr(e, s, me.size) for e in range(epochs) for s in range(steps)]
    expected = steps_on_mean(me, model, keras.optimizers.Adam(), rates, cycle=steps)
    optimizer = compile_distributed(me, model, keras.optimizers.Adam(WARMUP_LR))
    used: list[float] = []
    logged: list[dict[str, float]] = []
    callbacks = [
        hvd.callbacks.BroadcastGlobalVariablesCallback(0),
        hvd.callbacks.MetricAverageCallback(),
        hvd.callbacks.LearningRateWarmupCallback(
            initial_lr=WARMUP_LR, warmup_epochs=WARMUP_EPOCHS, steps_per_epoch=WARMUP_STEPS
        ),
        keras.callbacks.LambdaCallback(
            on_batch_begin=lambda step, logs: used.append(float(optimizer.learning_rate.numpy()))
        ),
        recorder(keras, logged),
    ]
    model.fit(
        dataset(me, steps), epochs=epochs, steps_per_epoch=steps, callbacks=callbacks, verbose=0
    )
    assert_close(used, rates, "the lr of each step")
    epoch_lr = [e.get("lr") for e in logged]
    want = [warmup_lr(e, steps - 1, me.size) for e in range(epochs)]
    assert_close(epoch_lr, want, "the lr logged per epoch")
    assert_close(
        flat(model.get_weights()), flat(expected.get_weights()),
        "weights vs Adam on the mean at the warmup's rates",
    )  # fmt: skip
    return {"same": {"step_lr": used, "epoch_lr": epoch_lr}}


CHECKS: dict[str, Check] = {
    "metric_average_callback": metric_average_callback,
    "lr_warmup_callback": lr_warmup_callback,
}
