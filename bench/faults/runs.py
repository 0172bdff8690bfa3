"""The fault benchmark's shared parts: its settings, a local job with every line stamped, a
trial's record, and `Bench` (sizes, the model, scratch space, the GCS emulator, a dataset)."""

from __future__ import annotations

import contextlib
import itertools
import os
import re
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from unittest import mock

from bench.common import fresh, median
from components.common import storage
from components.train.config import TrainConfig

EPOCHS = {"full": 6, "quick": 4}
TRAIN_LIMIT = {"full": 0, "quick": 1000}  # bundled digits: 4,000 train / 1,000 test (0: all)
GCS_SHARE = 0.1  # of GCS requests answered 503 or 429
# Short stall settings for the job whose rank is frozen, and only it (job_environment keeps what
# is set): its watch's 5 s silence bound (the stall shutdown time) and Horovod's own 5 s stall
# shutdown read a live rank that a loaded machine delays as hung (TensorFlow's import holds the
# GIL: beats 2 s apart, measured under two busy processes on 2 cores), so every other job runs
# under the project's defaults (launch.job_environment).
STALL_ENV = {"HOROVOD_STALL_CHECK_TIME_SECONDS": "2", "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": "5"}
JOB_TIMEOUT_S = 600
CHECKPOINT_LINE = re.compile(r"checkpoint after epoch (\d+) written")
RESUME_LINE = re.compile(r"resuming from checkpoint after epoch (\d+) of")


# --- running a local job, every line stamped -------------------------------------------------


@dataclass
class LaunchThread:
    """`launch.run_local` in a thread; `lines` are (monotonic time, line) as they arrive."""

    config: TrainConfig
    env: dict[str, str]
    lines: list[tuple[float, str]] = field(default_factory=list)
    code: int | None = None
    started: float = 0.0
    ended: float = 0.0

    def start(self) -> LaunchThread:
        from components.train.launcher.launch import run_local

        def run() -> None:
            try:
                self.code = run_local(self.config, JOB_TIMEOUT_S, stamped(self.lines), self.env)
            finally:
                self.ended = time.monotonic()

        self.started = time.monotonic()
        self._thread = threading.Thread(target=run, daemon=True)
        self._thread.start()
        return self

    def wait(self) -> int:
        self._thread.join(JOB_TIMEOUT_S + 60)
        if self.code is None:
            raise RuntimeError(f"job did not finish: {self.tail()}")
        return self.code

    def succeed(self) -> LaunchThread:
        """Start, wait; raise with the output's tail unless the job succeeds."""
        if self.start().wait() != 0:
            raise RuntimeError(f"the job failed: {self.tail()}")
        return self

    def first(self, pattern: str | re.Pattern[str]) -> tuple[float, re.Match[str]] | None:
        """When the first line matching `pattern` came, and the match."""
        for t, line in list(self.lines):
            if m := re.search(pattern, line):
                return t, m
        return None

    def wait_for(self, pattern: str) -> float:
        """Block until a line matches `pattern`; its time. Raises if the job ends first."""
        while (hit := self.first(pattern)) is None:
            if not self._thread.is_alive():
                raise RuntimeError(f"job ended before {pattern!r}: {self.tail()}")
            time.sleep(0.02)
        return hit[0]

    def tail(self, n: int = 30) -> str:
        return "\n".join(line for _, line in self.lines[-n:])


def stamped(lines: list[tuple[float, str]]) -> Callable[[str], None]:
    """A log callback that appends (monotonic time, line) to `lines`."""
    return lambda line: lines.append((time.monotonic(), line))


def progress_at(lines: list[tuple[float, str]], t: float) -> float:
    """Epochs of training done at time `t`: the last checkpoint before it, plus the part of an
    epoch since (median time between checkpoints as the epoch's length)."""
    marks = [(ts, int(m.group(1))) for ts, line in lines if (m := CHECKPOINT_LINE.search(line))]
    before = [(ts, k) for ts, k in marks if ts <= t]
    if not before:
        return 0.0
    ts, k = before[-1]
    gaps = [b[0] - a[0] for a, b in itertools.pairwise(marks)]
    return k + min(1.0, (t - ts) / median(gaps)) if gaps else float(k)


def resumed_epoch(lines: list[tuple[float, str]]) -> tuple[float, int] | None:
    """When the rerun said it resumed, and from which epoch."""
    for ts, line in lines:
        if m := RESUME_LINE.search(line):
            return ts, int(m.group(1))
    return None


def record(fault: str, trial: int, survived: bool, **figures: Any) -> dict[str, Any]:
    """One trial's record: the figures every fault has, then the fault's details."""
    keys = ("epochs_lost", "time_to_recover_s", "models_exported", "half_written")
    lost, recover, models, half = (figures.pop(k) for k in keys)
    return {
        "fault": fault,
        "trial": trial,
        "survived": bool(survived and models == 1 and not half),
        "epochs_lost": round(float(lost), 2),
        "time_to_recover_s": round(float(recover), 2),
        "models_exported": models,
        "half_written": half,
        "details": figures,
    }


# --- the bench's shared parts -----------------------------------------------------------------


@dataclass
class Bench:
    """What the runners share: sizes, the model, scratch space, the GCS emulator, a dataset."""

    work: Path
    size: str  # full | quick
    model: str
    emulator: str
    data: str = ""
    trial: int = 0
    _buckets: Iterator[int] = field(default_factory=itertools.count)
    _base: Path | None = None

    @property
    def epochs(self) -> int:
        return EPOCHS[self.size]

    def config(self, data: str, output: str, epochs: int) -> TrainConfig:
        """A 2-rank job of the chosen model, one thread per rank."""
        return TrainConfig(
            data=data, output=output, workers=2, epochs=epochs, threads_per_worker=1,
            model=self.model,
        )  # fmt: skip

    def out(self, fault: str) -> Path:
        return fresh(self.work / f"{fault}-{self.trial}")

    def env(self, **extra: str) -> dict[str, str]:
        return {**os.environ, **extra}

    def bucket(self) -> str:
        """A new bucket in the emulator, as ``gs://name``."""
        from standins.fake_gcs import create_bucket

        name = f"faults-{os.getpid()}-{next(self._buckets)}"
        create_bucket(self.emulator, name)
        return f"gs://{name}"

    def prepare(self, output: str) -> str:
        from components.data_prep.prep import prepare

        prepare("bundled", output, shard_size=1000, data_limit=TRAIN_LIMIT[self.size])
        return output

    def base_checkpoints(self) -> Path:
        """The checkpoints of a finished 2-epoch run (epochs 1 and 2), made once."""
        if self._base is None:
            out = self.work / "base-run"
            shutil.rmtree(out, ignore_errors=True)
            LaunchThread(self.config(self.data, str(out), 2), self.env()).succeed()
            self._base = out / "checkpoints"
        return self._base


def emulator_env(url: str) -> dict[str, str]:
    """The environment that points a GCS client at the emulator (or proxy) at `url`."""
    return {"STORAGE_EMULATOR_HOST": url, "GOOGLE_CLOUD_PROJECT": "emulator"}


@contextlib.contextmanager
def gcs_host(url: str) -> Iterator[None]:
    """This process's GCS client talks to `url` within the block."""
    with mock.patch.dict(os.environ, emulator_env(url)):
        storage._client.cache_clear()
        try:
            yield
        finally:
            storage._client.cache_clear()
