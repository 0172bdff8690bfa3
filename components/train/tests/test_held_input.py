"""The training input held past ``fit``, and the rank's process ended without destroying it
(`components.train.rank.held_input`). Real Keras and ``tf.data``; the exit in a real subprocess.

What this buys, the seconds a rank does not wait, is a time: ``bench.pipeline_overhead``
measures it, not these tests.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np

from components.common.keras_env import keras
from components.train.rank import held_input

ROOT = Path(__file__).resolve().parents[3]


def _fit_model(batches: int) -> tuple[object, object]:
    """A tiny model and `batches` batches of 4 samples, as a ``tf.data`` pipeline."""
    import tensorflow as tf

    k = keras()
    model = k.Sequential([k.layers.Input((3,)), k.layers.Dense(2, activation="softmax")])
    model.compile("sgd", "sparse_categorical_crossentropy", jit_compile=False)
    images = np.arange(batches * 12, dtype=np.float32).reshape(batches * 4, 3)
    data = tf.data.Dataset.from_tensor_slices((images, np.zeros(batches * 4, int))).batch(4)
    return model, data


def test_each_fit_leaves_the_iterator_its_steps_read_held() -> None:
    model, data = _fit_model(batches=8)
    before = len(held_input.HELD)
    callback = held_input.hold_callback(keras(), held_input.InputClock())
    model.fit(data, epochs=2, steps_per_epoch=3, verbose=0, callbacks=[callback], shuffle=False)
    assert len(held_input.HELD) == before + 1  # one iterator for the whole fit
    assert len(list(held_input.HELD[-1])) == 8 - 2 * 3  # the one the 6 steps read: 2 batches left
    step = model.train_function
    assert step is callback.step  # fit's own step function is back in place
    # A second fit (an elastic job's next attempt) holds its own iterator too.
    model.fit(data, epochs=1, steps_per_epoch=5, verbose=0, callbacks=[callback], shuffle=False)
    assert len(held_input.HELD) == before + 2
    assert len(list(held_input.HELD[-1])) == 8 - 5
    assert model.train_function is step


def test_the_clock_times_each_steps_wait_for_its_batch() -> None:
    """An input pipeline that takes 100 ms a batch: the steps wait about that long for each
    batch, and the clock says so; training reads the batches in order, and learns from them
    as Keras's own step does."""
    import tensorflow as tf

    model, data = _fit_model(batches=6)
    baseline, _ = _fit_model(batches=6)
    baseline.set_weights(model.get_weights())
    slow = data.map(lambda x, y: (tf.numpy_function(_after_100_ms, [x], tf.float32), y))
    clock = held_input.InputClock()
    callback = held_input.hold_callback(keras(), clock)
    model.fit(slow, epochs=1, steps_per_epoch=6, verbose=0, callbacks=[callback], shuffle=False)
    assert clock.take() >= 6 * 0.1 * 0.8 and clock.take() == 0.0
    baseline.fit(data, epochs=1, steps_per_epoch=6, verbose=0, shuffle=False)
    for ours, keras_own in zip(model.get_weights(), baseline.get_weights(), strict=True):
        np.testing.assert_allclose(ours, keras_own, rtol=1e-5)


def _after_100_ms(x: np.ndarray) -> np.ndarray:
    import time

    time.sleep(0.1)
    return x


def _exit_in_subprocess(hold: bool) -> subprocess.CompletedProcess[str]:
    script = textwrap.dedent(f"""
        import atexit
        from components.train.rank import held_input
        class Input:
            def __del__(self):
                print("destroyed", flush=True)

        atexit.register(lambda: print("exit handler ran"))  # buffered: the exit flushes it
        kept = Input()
        if {hold}:
            held_input.HELD.append(kept)
        del kept
        print("exiting", end=" ")
        held_input.exit_process(3)
    """)
    return subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, timeout=60
    )


def test_the_process_ends_with_its_exit_handlers_and_without_destroying_what_it_holds() -> None:
    held = _exit_in_subprocess(hold=True)
    assert held.returncode == 3, held.stderr
    assert held.stdout == "exiting exit handler ran\n"  # Horovod's shutdown, the heartbeat's
    # done: registered handlers like these still run; the held input is never destroyed.
    nothing_held = _exit_in_subprocess(hold=False)
    assert nothing_held.returncode == 3, nothing_held.stderr
    assert nothing_held.stdout == "destroyed\nexiting exit handler ran\n"  # a plain exit
