"""What the conformance checks share: the rank they run on, a small Keras model, each rank's own
data, and weights as one flat list.

Every input is a function of a seed or a rank, so any rank computes what every other rank holds,
and from that what a collective must give it: each check asserts on its own rank, after its last
collective (a rank that fails early would leave the other waiting in a collective).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

WORLD = 2
FEATURES, CLASSES, BATCH = 8, 4, 16
# Horovod's float32 results against the same sums and steps computed here (relative and absolute).
TOLERANCE = 1e-6
# ``horovodrun --check-build`` in a Python that has imported horovod.tensorflow: the check forks
# once per question (TensorFlow? MPI? Gloo? ...), and the forks then do not import TensorFlow
# again (7 s of CPU instead of 34 s). Also run in the trainer images (tests/containers).
CHECK_BUILD = (
    "import runpy, shutil, sys, horovod.tensorflow; sys.argv = ['horovodrun', '--check-build']; "
    "runpy.run_path(shutil.which('horovodrun'), run_name='__main__')"
)


def built_with(check_build_output: str) -> set[str]:
    """What ``horovodrun --check-build`` marks as built: frameworks, controllers, operations."""
    marks = re.findall(r"^\s*\[(X| )\] (\w+)", check_build_output, re.M)
    return {name for mark, name in marks if mark == "X"}


@dataclass(frozen=True)
class Rank:
    """This process in the job: Horovod's Keras API (as the trainer imports it), TF, Keras 3
    (``import keras``), the launcher that started it (``mpi``, ``gloo`` or ``elastic``), its
    rank and the size."""

    hvd: Any
    tf: Any
    keras: Any
    controller: str
    rank: int
    size: int


# A check: run on every rank, asserts on this rank's values, returns what the test compares.
Check = Callable[[Rank], dict[str, Any]]


def small_model(keras: Any, seed: int) -> Any:
    """Dense 16 relu, Dense 4 softmax over 8 features: its weights are `seed`'s."""
    keras.utils.set_random_seed(seed)
    return keras.Sequential(
        [
            keras.layers.Input(shape=(FEATURES,)),
            keras.layers.Dense(16, activation="relu"),
            keras.layers.Dense(CLASSES, activation="softmax"),
        ]
    )


def batch(step: int, rank: int) -> tuple[np.ndarray, np.ndarray]:
    """Rank `rank`'s batch of step `step`: different on every rank and every step."""
    rng = np.random.default_rng(1000 * step + rank)
    x = rng.normal(size=(BATCH, FEATURES)).astype(np.float32)
    y = rng.integers(0, CLASSES, size=BATCH).astype(np.int64)
    return x, y


def dataset(me: Rank, steps: int) -> Any:
    """This rank's `steps` batches as the trainer feeds ``fit``: a tf.data stream, repeated."""
    xs, ys = zip(*(batch(s, me.rank) for s in range(steps)), strict=True)
    data = me.tf.data.Dataset.from_tensor_slices((np.concatenate(xs), np.concatenate(ys)))
    return data.batch(BATCH).repeat()


def compile_distributed(me: Rank, model: Any, base: Any, **options: Any) -> Any:
    """Compile `model` as `components.train.rank.trainer.build_or_resume` does: the Keras 3
    optimizer `base` (not built yet) in Horovod's DistributedOptimizer, timed by the trainer's
    AllreduceClock, without XLA. Returns the optimizer."""
    from components.train.rank.telemetry import AllreduceClock

    optimizer = AllreduceClock(me.tf).wrap(me.hvd.DistributedOptimizer(base, **options))
    model.compile(
        optimizer=optimizer,
        loss="sparse_categorical_crossentropy",
        metrics=["accuracy"],
        jit_compile=False,
    )
    return optimizer


def resume_optimizer(optimizer: Any, model: Any, rank: int) -> None:
    """Build `optimizer` for `model` and give it rank `rank`'s own state, as a resumed job's
    optimizer holds one: ``iterations`` 10 + rank, and every other variable (the learning rate,
    Adam's moments) a positive value of its own per rank."""
    if not optimizer.built:
        optimizer.build(model.trainable_variables)
    rng = np.random.default_rng(500 + rank)
    for var in optimizer.variables:
        if var is optimizer.iterations:
            var.assign(10 + rank)
        else:
            var.assign(rng.uniform(0.001, 0.01, size=var.shape).astype(np.float32))


def optimizer_state(optimizer: Any) -> list[float]:
    """A Keras 3 optimizer's variables (``iterations``, the learning rate, the slots) as one flat
    list, in order."""
    return flat(v.numpy() for v in optimizer.variables)


def assert_close(actual: Any, desired: Any, what: str) -> None:
    """`actual` equals `desired` to TOLERANCE (relative and absolute), element by element."""
    np.testing.assert_allclose(
        np.asarray(actual, dtype=np.float64), np.asarray(desired, dtype=np.float64),
        rtol=TOLERANCE, atol=TOLERANCE, err_msg=what,
    )  # fmt: skip


def flat(arrays: Any) -> list[float]:
    """Weights (or tensors) as one flat list of floats, in order."""
    return [float(v) for a in arrays for v in np.asarray(a).ravel()]


def recorder(keras: Any, into: list[dict[str, float]]) -> Any:
    """A callback that appends a copy of each epoch's logs to `into`."""
    return keras.callbacks.LambdaCallback(
        on_epoch_end=lambda epoch, logs: into.append({k: float(v) for k, v in logs.items()})
    )


def collectives(timeline: str, phase: str) -> dict[str, int]:
    """How many times Horovod's timeline (rank 0's, a Chrome trace) records `phase` (e.g.
    ``ALLREDUCE``, ``BROADCAST``) for each tensor, by the tensor's name."""
    names = dict(
        re.findall(
            r'"name": "process_name", "ph": "M", "pid": (\d+), "args": \{"name": "([^"]+)"',
            timeline,
        )
    )
    counts: dict[str, int] = {}
    for pid in re.findall(rf'"ph": "B", "name": "{phase}", "ts": \d+, "pid": (\d+)', timeline):
        counts[names[pid]] = counts.get(names[pid], 0) + 1
    return counts


class Timeline:
    """Horovod's timeline around a block (the job runs with ``HOROVOD_TIMELINE=DYNAMIC``):
    ``with Timeline(me) as timeline: ...``, then `timeline.text` (rank 0's; "" elsewhere)."""

    def __init__(self, me: Rank) -> None:
        import tempfile

        self.me, self.text = me, ""
        self.path = Path(tempfile.mkdtemp(prefix="hvd-timeline-")) / "timeline.json"

    def __enter__(self) -> Timeline:
        self.me.hvd.start_timeline(str(self.path))
        return self

    def __exit__(self, *exc: object) -> None:
        self.me.hvd.stop_timeline()
        if self.me.rank == 0:
            self.text = self.path.read_text()
