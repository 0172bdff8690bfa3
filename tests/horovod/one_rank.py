"""The conformance suite's one-rank job: a job of one rank (a 1x1 run, each copy of two
independent jobs) trains with the DistributedOptimizer but has no one to average with, so its
steps must not go through Horovod's collective (the background thread would be a cost with no
use: patch 0002 skips it, as the Keras 2 path does). Run under ``mpirun -np 1`` with
``HOROVOD_TIMELINE`` set (`jobs.launch`); writes how far its weights are from plain Adam's
(``{"max_difference_from_adam": float}``) to ``OUT/RESULT``.

The timeline is how the test sees which collectives Horovod ran: rank 0's background thread
records each one by name. One allreduce named MARKER is run on purpose, so the test can tell a
timeline that records collectives from one that recorded nothing.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np

from tests.horovod.common import Rank, batch, compile_distributed, small_model

MARKER = "one_rank_marker"
RESULT = "one_rank.json"
STEPS = 4


def main(argv: list[str]) -> int:
    out, controller = Path(argv[0]), argv[1]
    out.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import horovod.tensorflow as hvt
    import horovod.tensorflow.keras as hvd
    import keras
    import tensorflow as tf

    hvd.init()
    me = Rank(hvd, tf, keras, controller, rank=hvd.rank(), size=hvd.size())
    assert me.size == 1, f"a one-rank job has size {me.size}"
    # (horovod.tensorflow's allreduce, in a graph: an eager op's name is not the one asked for)
    tf.function(lambda: hvt.allreduce(tf.constant([1.0]), name=MARKER))()
    trained, plain = small_model(keras, seed=3), small_model(keras, seed=3)
    compile_distributed(me, trained, keras.optimizers.Adam(0.01))
    plain.compile(
        optimizer=keras.optimizers.Adam(0.01), loss="sparse_categorical_crossentropy",
        jit_compile=False,
    )  # fmt: skip
    for step in range(STEPS):
        x, y = batch(step, rank=0)
        trained.train_on_batch(x, y)
        plain.train_on_batch(x, y)
    difference = max(
        float(np.max(np.abs(a - b)))
        for a, b in zip(trained.get_weights(), plain.get_weights(), strict=True)
    )
    hvd.shutdown()  # flushes the timeline
    (out / RESULT).write_text(json.dumps({"max_difference_from_adam": difference}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
