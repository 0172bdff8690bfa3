"""Device placement and threads per process.

There is no GPU on this machine, so the GPU case drives `configure_devices` with a stand-in
for ``tf.config`` that records what it is asked (the CPU case uses the real TensorFlow, in a
subprocess, since thread settings can only be made before TF starts).
"""

from __future__ import annotations

import json
import subprocess
import sys
from types import SimpleNamespace
from typing import Any

from components.train.trainer import configure_devices, default_threads


class _FakeConfig:
    def __init__(self, gpus: list[str]) -> None:
        self.gpus = gpus
        self.calls: list[tuple[str, Any]] = []
        self.experimental = SimpleNamespace(
            set_memory_growth=lambda gpu, on: self.calls.append(("memory_growth", (gpu, on)))
        )
        self.threading = SimpleNamespace(
            set_intra_op_parallelism_threads=lambda n: self.calls.append(("intra", n)),
            set_inter_op_parallelism_threads=lambda n: self.calls.append(("inter", n)),
        )

    def list_physical_devices(self, kind: str) -> list[str]:
        return self.gpus if kind == "GPU" else []

    def set_visible_devices(self, device: str, kind: str) -> None:
        self.calls.append(("visible", (device, kind)))


def test_each_process_is_pinned_to_the_gpu_of_its_local_rank() -> None:
    for local_rank in range(4):
        config = _FakeConfig(["gpu0", "gpu1", "gpu2", "gpu3"])
        device, threads = configure_devices(SimpleNamespace(config=config), local_rank, 4, None)
        assert device == f"GPU:{local_rank}"
        assert ("visible", (f"gpu{local_rank}", "GPU")) in config.calls
        assert ("memory_growth", (f"gpu{local_rank}", True)) in config.calls


def test_thread_override_wins() -> None:
    config = _FakeConfig([])
    device, threads = configure_devices(SimpleNamespace(config=config), 0, 2, 3)
    assert (device, threads) == ("CPU", 3)
    assert ("intra", 3) in config.calls and ("inter", 2) in config.calls


def test_default_threads_split_the_cores_among_local_ranks() -> None:
    import os

    cores = len(os.sched_getaffinity(0))
    assert default_threads(1) == cores
    assert default_threads(cores) == 1
    assert default_threads(cores * 4) == 1  # never zero


def test_cpu_run_uses_the_real_tensorflow_settings() -> None:
    code = """
import json, tensorflow as tf
from components.train.trainer import configure_devices
device, threads = configure_devices(tf, 0, 1, 1)
print(json.dumps([device, threads, tf.config.threading.get_intra_op_parallelism_threads()]))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.strip().splitlines()[-1]) == ["CPU", 1, 1]
