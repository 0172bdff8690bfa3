"""The conformance suite's elastic resize job: a local variable's gradient (``register_local_var``)
is scaled by 1/size, the size read when the step runs, not when the step was traced. An elastic
job (`test_horovod_conformance`'s ``test_a_local_gradient_follows_the_live_size``) starts with
one rank, which traces its train step and takes one step at 1/1; it then offers a second slot
(``LocalHosts.offer(2)``) and commits until Horovod resets the job with two ranks; rank 0 takes
one more step with the train function it traced at size 1: its local gradient must now be
halved. Rank 0 writes ``{"steps": {size: kernel change}}`` to ``OUT/RESULT``.

``python -m tests.horovod.live_size OUT HOSTS_DIR`` (HOSTS_DIR: the job's `LocalHosts`).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from components.train.launcher.launch import LocalHosts

RESULT = "live_size.json"
GROW_TIMEOUT_S = 180


def main(argv: list[str]) -> int:
    out, hosts = Path(argv[0]), LocalHosts(Path(argv[1]))
    out.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import horovod.tensorflow.keras as hvd
    import keras

    hvd.init()
    # One weight, its gradient 1 on every rank (the loss is the mean output of inputs of 1).
    model = keras.Sequential(
        [keras.Input(shape=(1,)), keras.layers.Dense(1, use_bias=False, kernel_initializer="zeros")]
    )
    optimizer = hvd.DistributedOptimizer(keras.optimizers.SGD(1.0))
    optimizer.register_local_var(model.layers[0].kernel)
    model.compile(optimizer=optimizer, loss=lambda y, p: keras.ops.mean(p), jit_compile=False)
    x = np.ones((4, 1), np.float32)
    state = hvd.elastic.KerasState(model, optimizer)
    steps: dict[int, float] = {}

    @hvd.elastic.run
    def train(state: Any) -> None:
        before = float(model.layers[0].kernel.numpy().ravel()[0])
        model.train_on_batch(x, x)
        steps[hvd.size()] = before - float(model.layers[0].kernel.numpy().ravel()[0])
        if hvd.size() > 1:
            return
        hosts.offer(2)  # grow: the driver finds the slot, then resets the job at a commit
        deadline = time.monotonic() + GROW_TIMEOUT_S
        while time.monotonic() < deadline:
            state.commit()  # raises HostsUpdatedInterrupt once the driver has the new host
            time.sleep(0.5)
        raise RuntimeError(f"the job did not grow within {GROW_TIMEOUT_S} s")

    train(state)
    if hvd.rank() == 0:
        (out / RESULT).write_text(json.dumps({"steps": steps}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
