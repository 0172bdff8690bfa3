"""Mixed precision on Keras 3 with Horovod (patch 0003): under ``mixed_float16`` a
``LossScaleOptimizer`` skips each step whose gradients are not finite. When only one rank's
batch overflows, every rank must skip it (a rank that skips leaves the other waiting in the
allreduce: Horovod's stall warning, then a hang), halve its loss scale alike and keep weights
identical, whichever wraps which: ``compile``'s own LossScaleOptimizer around the
DistributedOptimizer, or ``DistributedOptimizer(LossScaleOptimizer(...))``; and with gradient
accumulation, where the average waits for the end of the accumulation."""

from __future__ import annotations

import functools
from typing import Any

from tests.horovod.common import Check, Rank, batch, flat, small_model

STEPS, LEARNING_RATE, INITIAL_SCALE = 4, 0.05, 2.0**15
# float16's largest finite value is 65504: an input of 1e5 is infinite once the layer casts it.
OVERFLOW = 1e5


def overflow(me: Rank, wrap: str, accumulate: int | None = None) -> dict[str, Any]:
    """STEPS steps under ``mixed_float16``; rank 1's first batch overflows. Every rank skips
    that step (the optimizer's ``iterations`` count the other steps only), halves its loss
    scale once, and ends with the same weights, changed by the other steps."""
    keras, hvd = me.keras, me.hvd
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        model = small_model(keras, seed=7)
        before = flat(model.get_weights())
        base = keras.optimizers.SGD(LEARNING_RATE, gradient_accumulation_steps=accumulate)
        if wrap == "compile":  # compile wraps it in a LossScaleOptimizer
            optimizer = hvd.DistributedOptimizer(base)
        else:
            optimizer = hvd.DistributedOptimizer(keras.optimizers.LossScaleOptimizer(base))
        model.compile(
            optimizer=optimizer, loss="sparse_categorical_crossentropy", jit_compile=False
        )
        scaled = model.optimizer
        assert isinstance(scaled, keras.optimizers.LossScaleOptimizer), type(scaled)
        for step in range(STEPS):
            x, y = batch(step, me.rank)
            if step == 0 and me.rank == 1:
                x[0, 0] = OVERFLOW
            model.train_on_batch(x, y)
        scale = float(scaled.dynamic_scale.numpy())
        applied = int(base._iterations.numpy())  # micro-steps applied (Keras counts updates)
    finally:
        keras.mixed_precision.set_global_policy("float32")
    weights = flat(model.get_weights())
    assert scale == INITIAL_SCALE / 2, f"loss scale {scale}: the overflow was not seen here"
    assert applied == STEPS - 1, f"{applied} steps applied of {STEPS}, one overflowed"
    assert weights != before, "no step changed the weights"
    return {"same": {"weights": weights, "scale": scale, "applied": applied}}


CHECKS: dict[str, Check] = {
    "mixed_precision_overflow_compiled": functools.partial(overflow, wrap="compile"),
    "mixed_precision_overflow_explicit": functools.partial(overflow, wrap="explicit"),
    "mixed_precision_overflow_accumulated": functools.partial(
        overflow, wrap="compile", accumulate=2
    ),
}
