"""Horovod's Keras pieces on Keras 3 as the trainer uses them (components/train/rank/trainer.py):
the
DistributedOptimizer around Keras 3's Adam (and SGD with fp16 compression), and the broadcast
callback, in ``model.fit`` on each rank's own data, each compared with what one process computes
without Horovod from every rank's inputs. (The metric-average and warmup callbacks:
callback_checks.py; the refusals: refusal_checks.py.)"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import numpy as np

from tests.horovod.common import (
    TOLERANCE,
    Check,
    Rank,
    assert_close,
    batch,
    compile_distributed,
    dataset,
    flat,
    optimizer_state,
    resume_optimizer,
    small_model,
)

STEPS, LEARNING_RATE = 3, 0.01
# SGD's step is the gradient times this: fp16's rounding of the average (~5e-4 relative) then
# moves the weights past TOLERANCE (7e-5 after STEPS steps, measured), so the fp16 and the fp32
# average are told apart.
SGD_LEARNING_RATE = 1.0


def mean_gradient(me: Rank, model: Any, step: int, fp16: bool = False) -> list[Any]:
    """The mean over the ranks of each rank's gradient on its own batch of `step` (this rank
    computes every rank's). `fp16`: as Compression.fp16 averages, in float16 (each gradient
    rounded to float16, summed and halved in float16), back to float32."""
    tf, keras = me.tf, me.keras
    loss = keras.losses.SparseCategoricalCrossentropy()
    grads = []
    for rank in range(me.size):
        x, y = batch(step, rank)
        with tf.GradientTape() as tape:
            value = loss(y, model(x, training=True))
        grads.append(tape.gradient(value, model.trainable_variables))
    if not fp16:
        return [tf.add_n(list(g)) / me.size for g in zip(*grads, strict=True)]
    halves = [[tf.cast(t, tf.float16) for t in g] for g in zip(*grads, strict=True)]
    return [tf.cast(tf.add_n(h) / me.size, tf.float32) for h in halves]


def steps_on_mean(
    me: Rank,
    model: Any,
    optimizer: Any,
    rates: Sequence[float],
    fp16: bool = False,
    cycle: int | None = None,
    resume: int | None = None,
) -> Any:
    """What one process computes without Horovod: a copy of `model` (its optimizer resumed
    as rank `resume`'s, if given), then one step of the plain Keras 3 `optimizer` per learning
    rate in `rates`, step i on the `mean_gradient` of step i % `cycle` (the batches `fit`
    repeats; default: none repeated). Returns the copy; `optimizer` holds its state."""
    single = me.keras.models.clone_model(model)
    single.set_weights(model.get_weights())
    if resume is not None:
        resume_optimizer(optimizer, single, resume)
    for step, rate in enumerate(rates):
        optimizer.learning_rate = rate
        grads = mean_gradient(me, single, step % (cycle or len(rates)), fp16)
        optimizer.apply(grads, single.trainable_variables)
    return single


def distributed_optimizer(me: Rank, **options: Any) -> dict[str, Any]:
    """``hvd.DistributedOptimizer(Adam, **options)`` (trainer.build_or_resume; ``groups=2``:
    grouped allreduce, bench/variants.py's ``--groups``): STEPS steps on different data per
    rank give identical weights and optimizer state, those of plain Adam on the averaged
    gradient. (Adam's step barely depends on the gradient's scale, so a sum instead of an
    average shows in its moments, which are compared too.) The optimizer is still an Adam:
    serialized, it loads as Keras' own, without Horovod."""
    keras = me.keras
    model = small_model(keras, seed=7)  # the same initial weights on every rank
    initial = flat(model.get_weights())
    adam = keras.optimizers.Adam(learning_rate=LEARNING_RATE)
    expected = steps_on_mean(me, model, adam, [LEARNING_RATE] * STEPS)
    optimizer = compile_distributed(me, model, keras.optimizers.Adam(LEARNING_RATE), **options)
    model.fit(dataset(me, STEPS), epochs=1, steps_per_epoch=STEPS, verbose=0)
    weights = flat(model.get_weights())
    assert weights != initial, "the steps changed no weight"
    assert_close(weights, flat(expected.get_weights()), "weights vs Adam on the mean")
    assert_close(
        optimizer_state(optimizer), optimizer_state(adam),
        "optimizer variables (iterations, learning rate, moments) vs Adam on the mean",
    )  # fmt: skip
    assert int(optimizer.iterations.numpy()) == STEPS, optimizer.iterations
    loaded = keras.optimizers.deserialize(keras.optimizers.serialize(optimizer))
    assert type(loaded) is keras.optimizers.Adam, f"serialized, it loads as {type(loaded)}"
    return {"same": {"weights": weights, "optimizer_state": optimizer_state(optimizer)}}


def distributed_optimizer_fp16(me: Rank) -> dict[str, Any]:
    """``hvd.DistributedOptimizer(SGD, compression=Compression.fp16)``: the gradients travel as
    float16, so the weights are those of SGD on the float16 average of the ranks' gradients,
    which differ from those on the float32 average."""
    keras, hvd = me.keras, me.hvd
    model = small_model(keras, seed=7)
    rates = [SGD_LEARNING_RATE] * STEPS
    want = steps_on_mean(me, model, keras.optimizers.SGD(), rates, fp16=True).get_weights()
    fp32 = steps_on_mean(me, model, keras.optimizers.SGD(), rates).get_weights()
    base = keras.optimizers.SGD(learning_rate=SGD_LEARNING_RATE)
    compile_distributed(me, model, base, compression=hvd.Compression.fp16)
    model.fit(dataset(me, STEPS), epochs=1, steps_per_epoch=STEPS, verbose=0)
    weights = flat(model.get_weights())
    gap = np.max(np.abs(np.subtract(flat(want), flat(fp32))))
    assert gap > 10 * TOLERANCE, f"fp16 and fp32 averages too close to tell: {gap}"
    assert_close(weights, flat(want), "weights vs SGD on the fp16 mean")
    return {"same": {"weights": weights}}


def broadcast_callback(me: Rank, resumed: bool) -> dict[str, Any]:
    """BroadcastGlobalVariablesCallback(0) (trainer.callbacks): ranks that start from different
    weights hold rank 0's when training begins, before the first step, and then train as one.
    `resumed`: each rank's optimizer also holds its own state (built, its own iterations,
    learning rate and moments, as after a resume); every rank then holds rank 0's. Not
    resumed: the callback builds the optimizer (Keras 3 builds it in the first step) and
    broadcasts it, fresh. Either way the weights after STEPS steps are those of plain Adam
    from rank 0's state on the averaged gradient."""
    keras = me.keras
    begun: list[dict[str, list[float]]] = []
    held = []  # what every rank starts from; this rank trains its own
    for rank in range(me.size):
        model = small_model(keras, seed=100 + rank)
        optimizer = compile_distributed(me, model, keras.optimizers.Adam(LEARNING_RATE))
        if resumed:
            resume_optimizer(optimizer, model, rank)
        held.append((model, optimizer))
    start = [(flat(m.get_weights()), optimizer_state(o)) for m, o in held]
    model, optimizer = held[me.rank]
    adam = keras.optimizers.Adam(LEARNING_RATE)
    rate = float(held[0][1].learning_rate.numpy())  # rank 0's: resumed, its own
    expected = steps_on_mean(me, held[0][0], adam, [rate] * STEPS, resume=0 if resumed else None)
    callbacks = [
        me.hvd.callbacks.BroadcastGlobalVariablesCallback(0),
        keras.callbacks.LambdaCallback(
            on_train_begin=lambda logs: begun.append(
                {"weights": flat(model.get_weights()), "optimizer": optimizer_state(optimizer)}
            )
        ),
    ]
    model.fit(dataset(me, STEPS), epochs=1, steps_per_epoch=STEPS, callbacks=callbacks, verbose=0)
    assert start[0][0] != start[1][0], "the ranks must start with different weights"
    assert begun[0]["weights"] == start[0][0], "training began without rank 0's weights"
    if resumed:
        assert start[0][1] != start[1][1], "the ranks must start with different optimizers"
        assert begun[0]["optimizer"] == start[0][1], "training began without rank 0's optimizer"
    else:
        assert len(begun[0]["optimizer"]) > 2 * len(start[0][0]), "the optimizer is not built"
    assert_close(
        flat(model.get_weights()), flat(expected.get_weights()),
        "weights vs Adam from rank 0's state on the mean",
    )  # fmt: skip
    assert int(optimizer.iterations.numpy()) == int(adam.iterations.numpy()), optimizer.iterations
    return {"same": {"begun": begun[0], "optimizer_state": optimizer_state(optimizer)}}


CHECKS: dict[str, Check] = {
    "distributed_optimizer": distributed_optimizer,
    "distributed_optimizer_groups": functools.partial(distributed_optimizer, groups=2),
    "distributed_optimizer_fp16": distributed_optimizer_fp16,
    "broadcast_callback": functools.partial(broadcast_callback, resumed=False),
    "broadcast_callback_resumed": functools.partial(broadcast_callback, resumed=True),
}
