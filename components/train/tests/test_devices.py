"""Device placement and threads per process.

There is no GPU on this machine, so the GPU case drives `configure_devices` with a stand-in
for ``tf.config`` that records what it is asked (the CPU case uses the real TensorFlow, in a
subprocess, since thread settings can only be made before TF starts).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from components.train.cpus import cpu_quota, default_threads
from components.train.trainer import configure_devices


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


def test_inter_op_threads_override_the_rule() -> None:
    config = _FakeConfig([])
    configure_devices(SimpleNamespace(config=config), 0, 2, 1, inter_op=4)
    assert ("intra", 1) in config.calls and ("inter", 4) in config.calls
    config = _FakeConfig([])
    configure_devices(SimpleNamespace(config=config), 0, 2, 1)  # 0: min(2, intra), at least 1
    assert ("inter", 1) in config.calls


def test_default_threads_split_the_cores_among_local_ranks(tmp_path: Path) -> None:
    cores = len(os.sched_getaffinity(0))
    no_limit = tmp_path  # an empty cgroup directory: no CPU limit
    assert default_threads(1, no_limit) == cores
    assert default_threads(cores, no_limit) == 1
    assert default_threads(cores * 4, no_limit) == 1  # never zero


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


def _cgroup(tmp_path: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    return tmp_path


def test_cpu_limit_caps_the_threads_cgroup_v2(tmp_path: Path) -> None:
    """A container with a CPU limit of 1 (``cpu.max`` "100000 100000") gets 1 thread, whatever
    the visible cores: a Kubernetes CPU limit is a CFS quota, not an affinity mask. (The files
    stand in for the kernel's cgroup files; the container tests check a real ``--cpus``.)"""
    limited = _cgroup(tmp_path / "a", {"cpu.max": "100000 100000\n"})
    assert cpu_quota(limited) == 1.0
    assert default_threads(1, limited) == 1
    half = _cgroup(tmp_path / "b", {"cpu.max": "50000 100000\n"})
    assert cpu_quota(half) == 0.5 and default_threads(1, half) == 1  # never zero
    unlimited = _cgroup(tmp_path / "c", {"cpu.max": "max 100000\n"})
    assert cpu_quota(unlimited) is None
    assert default_threads(1, unlimited) == len(os.sched_getaffinity(0))


def test_cpu_limit_caps_the_threads_cgroup_v1(tmp_path: Path) -> None:
    two = _cgroup(
        tmp_path / "a", {"cpu/cpu.cfs_quota_us": "200000\n", "cpu/cpu.cfs_period_us": "100000\n"}
    )
    assert cpu_quota(two) == 2.0
    assert default_threads(2, two) == min(2, len(os.sched_getaffinity(0))) // 2 or 1
    none = _cgroup(
        tmp_path / "b", {"cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n"}
    )
    assert cpu_quota(none) is None
    assert cpu_quota(tmp_path / "missing") is None
