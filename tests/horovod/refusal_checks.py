"""What Horovod's Keras API cannot do on Keras 3 is refused (make/horovod/patches/0002), never
trained silently wrong: each refusal is one ValueError line that names Keras 3 and what to use
instead, raised before any step (the model and the optimizer are as they were)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from tests.horovod.common import Check, Rank, dataset, flat, small_model

LEARNING_RATE = 0.01


def refused(call: Callable[[], Any], *fix: str) -> str:
    """`call`'s ValueError: one line naming Keras 3 and each of `fix`."""
    try:
        call()
    except ValueError as error:
        message = str(error)
    else:
        what = getattr(call, "func", call)
        raise AssertionError(f"not refused: {getattr(what, '__qualname__', what)}") from None
    assert "\n" not in message, f"more than one line: {message!r}"
    for part in ("Keras 3", *fix):
        assert part in message, f"{part!r} not in {message!r}"
    return message


def backward_passes(me: Rank) -> dict[str, Any]:
    """``backward_passes_per_step=2``: Keras 3 accumulates gradients itself."""
    adam = me.keras.optimizers.Adam(LEARNING_RATE)
    call = functools.partial(me.hvd.DistributedOptimizer, adam, backward_passes_per_step=2)
    return {"message": refused(call, "gradient_accumulation_steps=2")}


def wrapped_twice(me: Rank) -> dict[str, Any]:
    """An optimizer wrapped twice (it would average twice), also inside a LossScaleOptimizer."""
    keras, hvd = me.keras, me.hvd
    adam = hvd.DistributedOptimizer(keras.optimizers.Adam(LEARNING_RATE))
    message = refused(functools.partial(hvd.DistributedOptimizer, adam), "wrap it", "once")
    scaled = keras.optimizers.LossScaleOptimizer(adam)
    refused(functools.partial(hvd.DistributedOptimizer, scaled), "wrap it", "once")
    return {"message": message}


def other_backend(me: Rank) -> dict[str, Any]:
    """Keras 3 on another backend than TensorFlow: Horovod's ops are TensorFlow ops. (jax,
    torch and openvino are not installed here, and Keras' numpy backend imports jax: so
    ``keras.backend.backend`` is replaced in this process for the call, as
    ``KERAS_BACKEND=jax`` would set it.)"""
    backend = me.keras.backend
    adam = me.keras.optimizers.Adam(LEARNING_RATE)
    real = backend.backend
    backend.backend = lambda: "jax"
    try:
        call = functools.partial(me.hvd.DistributedOptimizer, adam)
        message = refused(call, "KERAS_BACKEND=tensorflow")
    finally:
        backend.backend = real
    assert "'jax'" in message, message
    return {"message": message}


def _fit_refused(me: Rank, model: Any, callbacks: list[Any], *fix: str) -> str:
    """`model.fit` with `callbacks` refused, before any step: its weights and optimizer's
    ``iterations`` are as they were."""
    before = flat(model.get_weights())
    fit = functools.partial(
        model.fit, dataset(me, 2), epochs=1, steps_per_epoch=2, callbacks=callbacks, verbose=0
    )
    message = refused(fit, *fix)
    assert flat(model.get_weights()) == before, "the weights changed"
    assert int(model.optimizer.iterations.numpy()) == 0, model.optimizer.iterations
    return message


def xla_model(me: Rank) -> dict[str, Any]:
    """A model compiled with XLA (Keras 3's ``jit_compile='auto'`` picks it on a GPU) meets
    BroadcastGlobalVariablesCallback: this Horovod's collectives have no XLA kernels."""
    keras, hvd = me.keras, me.hvd
    model = small_model(keras, seed=7)
    optimizer = hvd.DistributedOptimizer(keras.optimizers.Adam(LEARNING_RATE))
    model.compile(optimizer=optimizer, loss="sparse_categorical_crossentropy", jit_compile=True)
    callbacks = [hvd.callbacks.BroadcastGlobalVariablesCallback(0)]
    return {"message": _fit_refused(me, model, callbacks, "jit_compile=False")}


def xla_step(me: Rank) -> dict[str, Any]:
    """A model compiled with XLA, trained with no Horovod callback: the DistributedOptimizer
    itself refuses while the first step is traced, before any collective."""
    keras, hvd = me.keras, me.hvd
    model = small_model(keras, seed=7)
    optimizer = hvd.DistributedOptimizer(keras.optimizers.Adam(LEARNING_RATE))
    model.compile(optimizer=optimizer, loss="sparse_categorical_crossentropy", jit_compile=True)
    return {"message": _fit_refused(me, model, [], "jit_compile=False")}


def _warmup_refused(me: Rank, base: Any, *fix: str) -> str:
    keras, hvd = me.keras, me.hvd
    model = small_model(keras, seed=7)
    model.compile(
        optimizer=hvd.DistributedOptimizer(base), loss="sparse_categorical_crossentropy",
        jit_compile=False,
    )  # fmt: skip
    warmup = hvd.callbacks.LearningRateWarmupCallback(
        initial_lr=LEARNING_RATE, warmup_epochs=1, steps_per_epoch=2
    )
    return _fit_refused(me, model, [warmup], *fix)


def lr_schedule(me: Rank) -> dict[str, Any]:
    """A learning-rate schedule meets the warmup callback, which sets a fixed rate each step:
    Keras 3 cannot set a schedule's rate."""
    keras = me.keras
    schedule = keras.optimizers.schedules.ExponentialDecay(LEARNING_RATE, 10, 0.9)
    adam = keras.optimizers.Adam(schedule)
    return {"message": _warmup_refused(me, adam, "float learning rate", "ExponentialDecay")}


CHECKS: dict[str, Check] = {
    "refuses_backward_passes_per_step": backward_passes,
    "refuses_wrapping_twice": wrapped_twice,
    "refuses_other_backend": other_backend,
    "refuses_xla_model": xla_model,
    "refuses_xla_step": xla_step,
    "refuses_lr_schedule": lr_schedule,
}
