"""The training input's iterators, held until this rank's process ends, and the process ended
without destroying them; and each step's wait for its batch, timed (`InputClock`). Runs in
each rank.
"""

from __future__ import annotations

import atexit
import os
import sys
import time
from typing import Any, NoReturn

HELD: list[Any] = []  # this process's training iterators, in the order their fits began


# Why: TensorFlow 2.21's ``tf.data`` autotuning gives every iterator a model thread
# (``tf_data_model``) that wakes to re-tune after 10 ms, then after twice as long each time, up to
# 60 s. Destroying the iterator waits for that thread's next wake-up: the iterator's cancellation
# does not wake it (gdb: the thread sits in ``Model::OptimizeLoop``'s timed wait). Keras drops its
# input iterator when ``fit`` returns, so a rank sat idle between its last step and its export for a
# time that grows with training: 2.1 s after 3.5 s of training in a plain Keras ``fit`` without
# Horovod, about 40 s at the end of a 24-epoch ``make run`` (``bench.pipeline_overhead``). Turning
# autotuning off removes the wait but cost 2x1 throughput (median 0.94 over 10 rounds).
#
# So every rank keeps the iterators its ``fit`` calls trained from (`hold_callback`), and ``python
# -m components.train.rank`` ends through `exit_process`: the exit handlers run as at any exit
# (Horovod's shutdown, the heartbeat's ``done``, logging's flush), then ``os._exit``, so no
# finalizer runs and none waits.
class InputClock:
    """Seconds this rank's steps waited for their batch: the input pipeline's share of a step."""

    def __init__(self) -> None:
        self.total = 0.0

    def take(self) -> float:
        """The seconds summed since the last `take`."""
        spent, self.total = self.total, 0.0
        return spent


def hold_callback(keras: Any, clock: InputClock) -> Any:
    """A Keras callback that holds, in `HELD`, the iterator each step of its ``fit`` reads, and
    times on `clock` each step's wait for its batch.

    ``fit`` makes its step function before ``on_train_begin``; the callback calls it through a
    wrapper, and puts it back at ``on_train_end``. The wrapper takes the step's batch from the
    iterator itself (``get_next``, which returns once the batch is ready: the wait is the
    input's) and hands Keras that one batch, which Keras's step function runs as it runs a
    batch read inside it (its one-step function on the data, traced once).
    """

    class HoldInput(keras.callbacks.Callback):  # type: ignore[misc, name-defined]
        def on_train_begin(self, logs: Any = None) -> None:
            self.step = step = self.model.train_function

            def train_function(iterator: Any) -> Any:
                if not HELD or HELD[-1] is not iterator:
                    HELD.append(iterator)
                began = time.perf_counter()
                batch = iterator.get_next()
                clock.total += time.perf_counter() - began
                return step([batch])

            self.model.train_function = train_function

        def on_train_end(self, logs: Any = None) -> None:
            self.model.train_function = self.step

    return HoldInput()


def exit_process(code: int) -> NoReturn:
    """End this process with `code`. With iterators held: run the exit handlers a normal exit
    runs, flush the standard streams, and leave by ``os._exit``, which destroys nothing."""
    if not HELD:
        sys.exit(code)
    atexit._run_exitfuncs()  # CPython's own exit sequence: the handlers, newest first
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
