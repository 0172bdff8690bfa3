"""One trainer rank that also records what each of its threads ran during the timed epochs.

``horovodrun -np 2 --gloo python -m bench.rank_profile OUT_DIR -- <trainer arguments>`` runs
the project's trainer (``components.train``) in every rank, unchanged, and each rank writes
``OUT_DIR/rank-<r>.json``: the window (start of the second epoch to the end of training, or
all of training if there is one epoch; wall clock and steps) and, per thread id, the CPU
seconds (user, system) it used in that window and where it came from:

- ``main``: the Python thread (Keras' loop, callbacks, the ops TF runs on its caller);
- ``horovod``: started by ``hvd.init()`` (Horovod's background thread, Gloo's I/O threads);
- ``tensorflow``: started after that (TF's intra- and inter-op pools, tf.data's threads);
- ``import``: already there when TF and Horovod had been imported.

Linux only (``/proc/self/task``). ``bench.levers --profile`` runs it and reads the files.
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


def thread_cpu() -> dict[int, tuple[float, float]]:
    """CPU seconds (user, system) of every live thread of this process, by thread id."""
    ticks = os.sysconf("SC_CLK_TCK")
    out = {}
    for task in Path("/proc/self/task").iterdir():
        try:
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # the thread ended meanwhile
        out[int(task.name)] = (int(fields[11]) / ticks, int(fields[12]) / ticks)
    return out


@dataclass
class Recorder:
    """Which threads came from where, and their CPU time at the window's two ends."""

    out_dir: Path
    before_init: set[int] = field(default_factory=set)
    horovod: set[int] = field(default_factory=set)
    rank: int = 0
    epochs_begun: int = 0
    start: tuple[float, dict[int, tuple[float, float]]] = (0.0, {})
    start_step: int = 0
    steps: int = 0

    def mark_start(self, steps_done: int) -> None:
        self.start = (time.time(), thread_cpu())
        self.start_step = steps_done

    def origin(self, tid: int) -> str:
        if tid == os.getpid():
            return "main"
        if tid in self.horovod:
            return "horovod"
        return "import" if tid in self.before_init else "tensorflow"

    def write(self, steps_done: int) -> None:
        end_wall, end = time.time(), thread_cpu()
        start_wall, start = self.start
        threads = [
            {
                "tid": tid,
                "origin": self.origin(tid),
                "user_seconds": round(user - start.get(tid, (0.0, 0.0))[0], 3),
                "system_seconds": round(system - start.get(tid, (0.0, 0.0))[1], 3),
            }
            for tid, (user, system) in sorted(end.items())
        ]
        window = {
            "start_unix": start_wall,
            "end_unix": end_wall,
            "seconds": round(end_wall - start_wall, 4),
            "steps": steps_done - self.start_step,
        }
        record = {"rank": self.rank, "pid": os.getpid(), "window": window, "threads": threads}
        self.out_dir.mkdir(parents=True, exist_ok=True)
        (self.out_dir / f"rank-{self.rank}.json").write_text(json.dumps(record, indent=1))


def _callback(keras: Any, rec: Recorder) -> Any:
    class ThreadCPU(keras.callbacks.Callback):  # type: ignore[misc, name-defined]
        """Marks the window: from the second epoch's start (else training's) to its end."""

        steps_done = 0

        def on_train_begin(self, logs: Any = None) -> None:
            rec.mark_start(0)

        def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
            rec.epochs_begun += 1
            if rec.epochs_begun == 2:
                rec.mark_start(self.steps_done)

        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            self.steps_done += 1

        def on_train_end(self, logs: Any = None) -> None:
            rec.write(self.steps_done)

    return ThreadCPU()


def install(out_dir: Path) -> Recorder:
    """Wrap ``hvd.init`` and ``Model.fit`` of this process so that they feed a Recorder."""
    from components.common import keras_env

    keras = keras_env.keras()  # as the trainer does: Keras 2 first, then Horovod
    import horovod.tensorflow.keras as hvd

    rec = Recorder(out_dir, before_init=set(thread_cpu()))
    init, fit = hvd.init, keras.Model.fit

    def traced_init(*args: Any, **kwargs: Any) -> Any:
        result = init(*args, **kwargs)
        rec.horovod = set(thread_cpu()) - rec.before_init
        rec.rank = int(hvd.rank())
        return result

    def traced_fit(self: Any, *args: Any, callbacks: Any = None, **kwargs: Any) -> Any:
        return fit(self, *args, callbacks=[*(callbacks or []), _callback(keras, rec)], **kwargs)

    hvd.init = traced_init
    keras.Model.fit = traced_fit
    return rec


def main(argv: list[str] | None = None) -> int:
    """``OUT_DIR -- <trainer arguments>``: run this rank of the trainer, recording threads."""
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) < 2 or argv[1] != "--":
        print("usage: python -m bench.rank_profile OUT_DIR -- TRAINER_ARGS...", file=sys.stderr)
        return 2
    install(Path(argv[0]))
    from components.train import cli

    return cli.main(argv[2:])


if __name__ == "__main__":
    sys.exit(main())
