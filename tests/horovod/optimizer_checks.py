"""The Keras 3 DistributedOptimizer of patch 0003, beyond the trainer's plain Adam
(keras_checks.py): Keras 3's gradient accumulation with one allreduce per update (counted in
Horovod's timeline), the optimizer kept as the user built it (AdamW's
``exclude_from_weight_decay``, a subclass's own attribute, a state built already), sparse
gradients with ``gradient_predivide_factor`` and with fp16 compression, momentum correction
warned about once, and the broadcast callback's grouped broadcast (counted in the timeline).
Each compared with what one process computes from every rank's inputs."""

from __future__ import annotations

import functools
import warnings
from typing import Any

import numpy as np

from tests.horovod.common import (
    TOLERANCE,
    Check,
    Rank,
    Timeline,
    assert_close,
    collectives,
    compile_distributed,
    dataset,
    flat,
    optimizer_state,
    resume_optimizer,
    small_model,
)
from tests.horovod.keras_checks import mean_gradient, steps_on_mean

STEPS, LEARNING_RATE, SGD_LEARNING_RATE = 3, 0.01, 0.5
MICRO_STEPS, UPDATES = 4, 2
IN_PLACE = "HorovodBroadcastInplaceResource"


def _fit(me: Rank, model: Any, steps: int, **options: Any) -> None:
    model.fit(dataset(me, steps), epochs=1, steps_per_epoch=steps, verbose=0, **options)


def gradient_accumulation(me: Rank, average: bool | None) -> dict[str, Any]:
    """``SGD(gradient_accumulation_steps=4)`` in the DistributedOptimizer (with
    ``average_aggregated_gradients`` None, True or False): 8 micro-steps make 2 updates, each
    SGD on the mean over the ranks of the mean of 4 micro-steps' gradients (their sum, if
    False), and Horovod's timeline records 2 allreduces of each gradient, one per update."""
    keras, hvd = me.keras, me.hvd
    model = small_model(keras, seed=7)
    single = keras.models.clone_model(model)
    single.set_weights(model.get_weights())
    sgd = keras.optimizers.SGD(SGD_LEARNING_RATE)
    for update in range(UPDATES):
        micro = [mean_gradient(me, single, MICRO_STEPS * update + k) for k in range(MICRO_STEPS)]
        factor = 1.0 if average is not False else float(MICRO_STEPS)
        sgd.apply(
            [sum(g) / MICRO_STEPS * factor for g in zip(*micro, strict=True)],
            single.trainable_variables,
        )
    name = f"accumulate_{average}"
    base = keras.optimizers.SGD(SGD_LEARNING_RATE, gradient_accumulation_steps=MICRO_STEPS)
    options = {} if average is None else {"average_aggregated_gradients": average}
    optimizer = hvd.DistributedOptimizer(base, name=name, **options)
    model.compile(optimizer=optimizer, loss="sparse_categorical_crossentropy", jit_compile=False)
    with Timeline(me) as timeline:
        _fit(me, model, MICRO_STEPS * UPDATES)
    weights = flat(model.get_weights())
    assert_close(weights, flat(single.get_weights()), "weights vs SGD on the accumulated mean")
    assert int(optimizer.iterations.numpy()) == UPDATES, optimizer.iterations
    if me.rank == 0:
        counts = {k: v for k, v in collectives(timeline.text, "ALLREDUCE").items() if name in k}
        assert len(counts) == len(model.trainable_variables), counts
        assert set(counts.values()) == {UPDATES}, f"allreduces per gradient: {counts}"
    return {"same": {"weights": weights}}


def keeps_adamw_exclusion(me: Rank) -> dict[str, Any]:
    """``AdamW(weight_decay=0.2)`` with ``exclude_from_weight_decay(var_names=["bias"])``, a
    setting its configuration does not carry: the DistributedOptimizer returns that AdamW
    itself, and the weights after STEPS steps are AdamW's with the exclusion on the mean
    gradient (without it, the biases would decay: checked to differ)."""
    keras = me.keras
    model = small_model(keras, seed=7)

    def adamw(exclude: bool) -> Any:
        built = keras.optimizers.AdamW(LEARNING_RATE, weight_decay=0.2)
        if exclude:
            built.exclude_from_weight_decay(var_names=["bias"])
        return built

    rates = [LEARNING_RATE] * STEPS
    expected = steps_on_mean(me, model, adamw(exclude=True), rates).get_weights()
    decayed = steps_on_mean(me, model, adamw(exclude=False), rates).get_weights()
    mine = adamw(exclude=True)
    assert compile_distributed(me, model, mine) is mine, "the optimizer was not kept"
    _fit(me, model, STEPS)
    weights = flat(model.get_weights())
    gap = np.max(np.abs(np.subtract(flat(expected), flat(decayed))))
    assert gap > 10 * TOLERANCE, f"the exclusion changes too little to tell: {gap}"
    assert_close(weights, flat(expected), "weights vs AdamW excluding the biases")
    return {"same": {"weights": weights}}


def keeps_subclass(me: Rank) -> dict[str, Any]:
    """A custom optimizer, an SGD subclass whose step is scaled by an attribute set after it was
    built (not in its configuration): the DistributedOptimizer keeps the instance, attribute
    and all, and the weights are SGD's at the scaled rate on the mean gradient."""
    keras = me.keras

    class ScaledSGD(keras.optimizers.SGD):  # type: ignore[misc, name-defined]
        def update_step(self, gradient: Any, variable: Any, learning_rate: Any) -> None:
            self.assign_sub(variable, gradient * learning_rate * self.scale)

    model = small_model(keras, seed=7)
    mine = ScaledSGD(SGD_LEARNING_RATE)
    mine.scale = 3.0
    expected = steps_on_mean(me, model, keras.optimizers.SGD(), [SGD_LEARNING_RATE * 3.0] * STEPS)
    optimizer = compile_distributed(me, model, mine)
    assert optimizer is mine and isinstance(optimizer, ScaledSGD), type(optimizer)
    _fit(me, model, STEPS)
    weights = flat(model.get_weights())
    assert_close(weights, flat(expected.get_weights()), "weights vs SGD at 3x the rate")
    return {"same": {"weights": weights}}


def keeps_built_state(me: Rank) -> dict[str, Any]:
    """An Adam built already, with a state of its own (as after a resume), then wrapped: its
    variables are the same objects with the same values, and the weights after STEPS steps are
    Adam's from that state on the mean gradient."""
    keras, hvd = me.keras, me.hvd
    model = small_model(keras, seed=7)
    adam = keras.optimizers.Adam(LEARNING_RATE)
    resume_optimizer(adam, model, rank=0)
    held, state = list(adam.variables), optimizer_state(adam)
    reference = keras.optimizers.Adam(LEARNING_RATE)
    rate = float(adam.learning_rate.numpy())
    expected = steps_on_mean(me, model, reference, [rate] * STEPS, resume=0)
    assert hvd.DistributedOptimizer(adam) is adam
    assert [id(v) for v in adam.variables] == [id(v) for v in held], "variables replaced"
    assert optimizer_state(adam) == state, "the state changed when wrapped"
    model.compile(optimizer=adam, loss="sparse_categorical_crossentropy", jit_compile=False)
    _fit(me, model, STEPS)
    weights = flat(model.get_weights())
    assert_close(weights, flat(expected.get_weights()), "weights vs Adam from the built state")
    return {"same": {"weights": weights}}


VOCABULARY, EMBEDDING, TOKENS = 20, 3, 5


def _embedding_model(keras: Any) -> Any:
    keras.utils.set_random_seed(11)
    return keras.Sequential(
        [
            keras.layers.Input(shape=(TOKENS,), dtype="int32"),
            keras.layers.Embedding(VOCABULARY, EMBEDDING),
            keras.layers.Flatten(),
            keras.layers.Dense(1),
        ]
    )


def _tokens(step: int, rank: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(700 + 10 * step + rank)
    return (
        rng.integers(0, VOCABULARY, size=(8, TOKENS)).astype(np.int32),
        rng.normal(size=(8, 1)).astype(np.float32),
    )


def _sparse_gradients(me: Rank, model: Any, step: int, fp16: bool) -> list[Any]:
    """The mean over the ranks of each rank's gradient (the Embedding's an IndexedSlices,
    densified here). `fp16`: as compression sends them, the sparse gradient's values rounded
    to float16 (gathered, then averaged in float32), the dense ones averaged in float16."""
    tf = me.tf
    grads = []
    for rank in range(me.size):
        x, y = _tokens(step, rank)
        with tf.GradientTape() as tape:
            value = tf.reduce_mean(tf.square(model(x, training=True) - y))
        got = tape.gradient(value, model.trainable_variables)
        assert isinstance(got[0], tf.IndexedSlices), type(got[0])
        if fp16:
            got[0] = tf.IndexedSlices(
                tf.cast(tf.cast(got[0].values, tf.float16), tf.float32),
                got[0].indices,
                got[0].dense_shape,
            )
        grads.append([tf.convert_to_tensor(g) for g in got])
    per_variable = list(zip(*grads, strict=True))
    mean = [tf.add_n(list(g)) / me.size for g in per_variable]
    if fp16:
        halves = [[tf.cast(t, tf.float16) for t in g] for g in per_variable[1:]]
        mean[1:] = [tf.cast(tf.add_n(h) / me.size, tf.float32) for h in halves]
    return mean


def sparse(me: Rank, **options: Any) -> dict[str, Any]:
    """An Embedding's sparse gradients (IndexedSlices, Keras 3's default) through the
    DistributedOptimizer with `options`: ``gradient_predivide_factor=2`` (upstream: refused
    at the first step) gives SGD on the mean; fp16 compression, SGD on the mean of the
    float16-rounded gradients (upstream sent them uncompressed), which is told apart from the
    float32 mean."""
    keras = me.keras
    fp16 = "compression" in options
    model = _embedding_model(keras)
    single, exact = _embedding_model(keras), _embedding_model(keras)
    sgd = keras.optimizers.SGD(SGD_LEARNING_RATE)
    for step in range(STEPS):
        sgd.apply(_sparse_gradients(me, single, step, fp16), single.trainable_variables)
    optimizer = me.hvd.DistributedOptimizer(keras.optimizers.SGD(SGD_LEARNING_RATE), **options)
    model.compile(optimizer=optimizer, loss="mse", jit_compile=False)
    for step in range(STEPS):
        model.train_on_batch(*_tokens(step, me.rank))
    weights = flat(model.get_weights())
    assert_close(weights, flat(single.get_weights()), f"weights vs SGD on the mean ({options})")
    if fp16:
        plain = keras.optimizers.SGD(SGD_LEARNING_RATE)
        for step in range(STEPS):
            plain.apply(_sparse_gradients(me, exact, step, False), exact.trainable_variables)
        gap = np.max(np.abs(np.subtract(weights, flat(exact.get_weights()))))
        assert gap > 10 * TOLERANCE, f"fp16 and fp32 too close to tell: {gap}"
    return {"same": {"weights": weights}}


def momentum_correction_warns(me: Rank) -> dict[str, Any]:
    """``LearningRateWarmupCallback`` (momentum correction on by default) with
    ``SGD(momentum=0.9)``, in two fits: rank 0 warns once, naming momentum_correction=False,
    rank 1 not at all, and training goes on with the warmup's rates (the weights those of SGD
    with momentum on the mean gradient at those rates)."""
    from tests.horovod.callback_checks import WARMUP_EPOCHS, WARMUP_LR, WARMUP_STEPS, warmup_lr

    keras, hvd = me.keras, me.hvd
    model = small_model(keras, seed=7)
    rates = [warmup_lr(e, s, me.size) for e in range(WARMUP_EPOCHS) for s in range(WARMUP_STEPS)]
    reference = keras.optimizers.SGD(momentum=0.9)
    expected = steps_on_mean(me, model, reference, rates * 2, cycle=WARMUP_STEPS)
    compile_distributed(me, model, keras.optimizers.SGD(WARMUP_LR, momentum=0.9))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):
            warmup = hvd.callbacks.LearningRateWarmupCallback(
                initial_lr=WARMUP_LR, warmup_epochs=WARMUP_EPOCHS, steps_per_epoch=WARMUP_STEPS
            )
            model.fit(
                dataset(me, WARMUP_STEPS),
                epochs=WARMUP_EPOCHS,
                steps_per_epoch=WARMUP_STEPS,
                callbacks=[warmup],
                verbose=0,
            )
    said = [str(w.message) for w in caught if "momentum" in str(w.message)]
    assert len(said) == (1 if me.rank == 0 else 0), said
    if said:
        assert "Keras 3" in said[0] and "momentum_correction=False" in said[0], said[0]
    weights = flat(model.get_weights())
    assert_close(weights, flat(expected.get_weights()), "weights vs SGD with momentum")
    return {"same": {"weights": weights}}


def grouped_broadcast(me: Rank) -> dict[str, Any]:
    """``BroadcastGlobalVariablesCallback(0)`` over a model of 8 Dense layers (16 variables,
    Adam's 34 more): Horovod's timeline records the 50 broadcasts in at most 3 Horovod
    operations (one per dtype of the model's and of the optimizer's variables: float32, and the
    optimizer's int64 ``iterations``), each enqueuing its variables at once, in place, not one
    operation per variable; and every rank holds rank 0's weights when training begins."""
    keras, hvd = me.keras, me.hvd

    def deep(seed: int) -> Any:
        keras.utils.set_random_seed(seed)
        layers = [keras.layers.Dense(4) for _ in range(8)]
        return keras.Sequential([keras.layers.Input(shape=(4,)), *layers])

    model, rank0 = deep(100 + me.rank), deep(100)  # different weights on every rank
    optimizer = hvd.DistributedOptimizer(keras.optimizers.Adam(LEARNING_RATE))
    model.compile(optimizer=optimizer, loss="mse", jit_compile=False)
    begun: list[list[float]] = []
    callbacks = [
        hvd.callbacks.BroadcastGlobalVariablesCallback(0),
        keras.callbacks.LambdaCallback(
            on_train_begin=lambda logs: begun.append(flat(model.get_weights()))
        ),
    ]
    x = np.ones((4, 4), np.float32)
    with Timeline(me) as timeline:
        model.fit(x, x, epochs=1, batch_size=4, callbacks=callbacks, verbose=0)
    assert begun[0] == flat(rank0.get_weights()), "training began without rank 0's weights"
    if me.rank == 0:
        # An in-place broadcast operation names its variables' tensors <op>_0, <op>_1, ...: so
        # the operations are counted by their first tensors (an eager per-variable broadcast's
        # tensors are all named HorovodBroadcast).
        counts = collectives(timeline.text, "BROADCAST")
        assert sum(counts.values()) == 16 + 34, counts
        assert all(k.startswith(IN_PLACE + "_") for k in counts), f"not in place: {counts}"
        operations = counts[IN_PLACE + "_0"]
        assert operations <= 3, f"{operations} operations for 16 + 34 variables"
    return {"same": {"begun": begun[0]}}


CHECKS: dict[str, Check] = {
    "gradient_accumulation_mean": functools.partial(gradient_accumulation, average=None),
    "gradient_accumulation_averaged": functools.partial(gradient_accumulation, average=True),
    "gradient_accumulation_summed": functools.partial(gradient_accumulation, average=False),
    "keeps_adamw_exclusion": keeps_adamw_exclusion,
    "keeps_custom_subclass": keeps_subclass,
    "keeps_built_state": keeps_built_state,
    "sparse_gradient_predivide": functools.partial(sparse, gradient_predivide_factor=2.0),
    "sparse_fp16_compression": lambda me: sparse(me, compression=me.hvd.Compression.fp16),
    "momentum_correction_warns": momentum_correction_warns,
    "grouped_broadcast": grouped_broadcast,
}
