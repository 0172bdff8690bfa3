"""Did the workers pay? The step split, the straggler, the advice, and the clock itself inside a
real 2-rank Horovod job."""

from __future__ import annotations

import subprocess
import sys

import pytest

from components.train.launcher import launch
from components.train.rank.telemetry import EpochCost, advice, resource_use, step_split, straggler
from standins.commands import static_command


def _cost(
    rank: int, allreduce_ms: float, step_ms: float = 100.0, cpu: float = 1.0, input_ms: float = 0
) -> EpochCost:
    steps = 10
    seconds = step_ms * steps / 1e3
    return EpochCost(
        rank,
        seconds,
        steps,
        allreduce_ms * steps / 1e3,
        cpu * seconds,
        1,
        (),
        input_ms * steps / 1e3,
    )


def test_the_shortest_allreduce_is_communication_the_rest_is_waiting() -> None:
    split = step_split([_cost(0, allreduce_ms=30), _cost(1, allreduce_ms=10)])
    assert split["step_seconds"] == pytest.approx(0.1)
    assert split["communication_share"] == pytest.approx(0.10)
    assert split["waiting_share"] == pytest.approx(0.10)  # rank 0 waited 20 ms: a mean of 10
    assert split["compute_share"] == pytest.approx(0.80)
    assert split["input_share"] == 0.0


def test_waiting_for_input_is_its_own_share_and_its_own_advice() -> None:
    """Ranks that wait 30 ms of a 100 ms step for their batch are told that the input is the
    bottleneck, not communication, though they wait for each other too."""
    epochs = [[_cost(0, 12, cpu=0.5, input_ms=30), _cost(1, 8, cpu=0.5, input_ms=30)]]
    use = resource_use(epochs, {0: "a", 1: "b"})
    assert use["input_share"] == pytest.approx(0.30)
    assert use["compute_share"] == pytest.approx(1 - 0.08 - 0.02 - 0.30)
    assert use["per_rank"][0]["input_ms"] == 30.0 and use["per_rank"][0]["compute_ms"] == 58.0
    (note,) = use["advice"]
    assert note.startswith("the ranks wait 30% of a step for their input (reading and decoding")
    assert "the input is the bottleneck, not communication" in note


def test_a_rank_computing_more_than_10_percent_slower_is_named() -> None:
    ranks = [
        {"rank": 0, "host": "w-0", "compute_ms": 100.0},
        {"rank": 1, "host": "w-1", "compute_ms": 125.0},
        {"rank": 2, "host": "w-2", "compute_ms": 102.0},
    ]
    assert straggler(ranks) == {"rank": 1, "host": "w-1", "slower_by": 0.238}
    ranks[1]["compute_ms"] = 108.0
    assert straggler(ranks) is None
    assert straggler(ranks[:1]) is None  # a job of one


def test_the_first_epoch_is_left_out_and_the_advice_says_what_to_change() -> None:
    warmup = [_cost(0, 90), _cost(1, 90)]  # tracing: not what the job costs
    epochs = [warmup, *[[_cost(0, 40), _cost(1, 25)] for _ in range(3)]]
    use = resource_use(epochs, {0: "w-0", 1: "w-1"})
    assert use["epochs_measured"] == 3
    assert use["communication_share"] == pytest.approx(0.25)
    assert use["estimated_efficiency"] == use["compute_share"] == pytest.approx(0.675)
    assert use["per_rank"][0] == {
        "rank": 0,
        "host": "w-0",
        "step_ms": 100.0,
        "compute_ms": 60.0,
        "allreduce_ms": 40.0,
        "input_ms": 0.0,
        "cpu_cores_busy": 1.0,
        "threads": 1,
    }
    assert use["straggler"] == {"rank": 1, "host": "w-1", "slower_by": 0.25}  # waits least
    assert use["advice"] == [
        "communication is 25% of a step and waiting for slower ranks 8%: try a larger batch per "
        "worker, or fewer, bigger workers (more threads or GPUs each)",
        "rank 1 on w-1 computes 25% slower than the others and the job waits for it every step: "
        "check what else runs on its node and its CPU limit",
    ]


def test_idle_threads_are_named_and_a_good_job_is_told_so() -> None:
    idle = resource_use([[_cost(0, 2, cpu=0.3), _cost(1, 1, cpu=1.0)]], {0: "a", 1: "b"})
    assert idle["advice"] == [
        "rank 0 kept 0.3 cores busy with 1 thread(s): it waits on its input, its storage or its "
        "CPU limit, not on compute"
    ]
    good = resource_use([[_cost(0, 3), _cost(1, 2)]], {0: "a", 1: "b"})
    assert advice(good) == [
        "the workers paid: compute is 0.97 of a step, the estimated scaling efficiency; nothing "
        "to change"
    ]


# Each rank trains a small dense model through Horovod's DistributedOptimizer with the clock;
# rank 1 sleeps 300 ms before every step, so rank 0 waits about that long in every allreduce. The
# clock is read after every step: the median step is what the ranks waited, where a sum would
# also count the moments a loaded machine descheduled one rank and the other waited for that.
RANK_PROGRAM = """
import statistics, sys, time
from components.common import keras_env
keras = keras_env.keras()
import horovod.tensorflow.keras as hvd
import numpy as np
import tensorflow as tf
from components.train.rank.telemetry import AllreduceClock
hvd.init()
clock = AllreduceClock(tf)
model = keras.Sequential([keras.Input((32,)), keras.layers.Dense(64), keras.layers.Dense(10)])
model.compile(optimizer=clock.wrap(hvd.DistributedOptimizer(keras.optimizers.Adam())),
              loss="mse", jit_compile=False)
steps = []
class Late(keras.callbacks.Callback):
    def on_train_batch_begin(self, batch, logs=None):
        if hvd.rank() == 1:
            time.sleep(0.3)
    def on_train_batch_end(self, batch, logs=None):
        steps.append(clock.take())
model.fit(np.zeros((320, 32)), np.zeros((320, 10)), batch_size=32, epochs=2, verbose=0,
          callbacks=[Late(), hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
steps.clear()
model.fit(np.zeros((320, 32)), np.zeros((320, 10)), batch_size=32, epochs=1, verbose=0,
          callbacks=[Late()])
sys.stdout.write(f"IN_ALLREDUCE {hvd.rank()} {statistics.median(steps)}\\n")  # one tagged line
sys.stdout.flush()
"""


@pytest.mark.horovod
def test_the_clock_sees_a_rank_wait_for_a_late_one_in_a_real_job() -> None:
    done = subprocess.run(
        static_command(2, [sys.executable, "-c", RANK_PROGRAM]),
        capture_output=True,
        text=True,
        timeout=180,
        env=launch.job_environment(None, 2),
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    median_step = {}
    for line in done.stdout.splitlines():
        if "IN_ALLREDUCE" in line:
            rank, seconds = line.split("IN_ALLREDUCE ")[1].split()
            median_step[int(rank)] = float(seconds)
    # The median step: rank 0 waited for rank 1's 300 ms of lateness (less its own step's
    # compute, milliseconds), rank 1 only for the data movement.
    assert median_step[0] > 0.2, median_step
    assert median_step[0] - median_step[1] > 0.15, median_step
