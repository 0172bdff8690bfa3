"""Devices and threads: the first thing each rank sets up after ``hvd.init()``
(`configure_devices`), and why a job that asked for GPUs must not train here (`gpu_problem`):
a job never trains on the CPU by mistake.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from components.common.defaults import IMAGE_NAMES
from components.common.keras_env import stderr_without

# What TensorFlow's CUDA build writes to stderr (absl, at error level) when it looks for GPUs on
# a host without an NVIDIA driver: once per process, so once per rank of a CPU job.
NO_DRIVER_NOISE = re.compile(r"failed call to cuInit")
CGROUP_ROOT = Path("/sys/fs/cgroup")


def cpu_quota(cgroup_root: Path = CGROUP_ROOT) -> float | None:
    """The CPU limit of this process's cgroup (v2 ``cpu.max``, or v1's CFS files) in cores, or
    None if no limit is set."""
    v2 = cgroup_root / "cpu.max"
    try:
        if v2.is_file():
            quota, period = v2.read_text().split()[:2]
            return None if quota == "max" else int(quota) / int(period)
        for v1 in (cgroup_root / "cpu", cgroup_root / "cpu,cpuacct"):
            if (v1 / "cpu.cfs_quota_us").is_file():
                quota_us = int((v1 / "cpu.cfs_quota_us").read_text())
                period_us = int((v1 / "cpu.cfs_period_us").read_text())
                return None if quota_us <= 0 or period_us <= 0 else quota_us / period_us
    except (OSError, ValueError):
        return None
    return None


# `configure_devices` pins the rank to the GPU of its local rank (if any) and sizes its CPU thread
# pools by `default_threads`: its share of the cores, capped by its CPU limit (a Kubernetes CPU
# limit is a CFS quota, which does not change the cores a process sees: a rank of a 64-core node
# limited to 2 would otherwise start 64 threads and be throttled).
def default_threads(local_size: int, cgroup_root: Path = CGROUP_ROOT) -> int:
    """The usable cores (a fractional limit rounds down) split among the `local_size` ranks
    of this host; never below 1."""
    cores = len(os.sched_getaffinity(0))  # the cores this process may be scheduled on (Linux)
    quota = cpu_quota(cgroup_root)
    if quota is not None:
        cores = min(cores, int(quota))
    return max(1, cores // max(1, local_size))


@dataclass(frozen=True)
class Devices:
    """Where this rank computes (``"GPU:<i>"`` or ``"CPU"``), its intra-op threads, and the GPUs
    TensorFlow found on its host."""

    device: str
    threads: int
    gpus_found: int

    @property
    def on_gpu(self) -> bool:
        return self.device.startswith("GPU")


def configure_devices(
    tf: Any, local_rank: int, local_size: int, threads: int | None, quiet: bool = False
) -> Devices:
    """Pin this process to one GPU by local rank, or run on CPU; set the thread counts (inter-op:
    at most 2), before TensorFlow executes any op. `quiet` (every rank but 0): TensorFlow's line
    about a host without a GPU driver is left to rank 0."""
    with stderr_without(NO_DRIVER_NOISE) if quiet else contextlib.nullcontext():
        gpus = tf.config.list_physical_devices("GPU")
    if gpus:
        gpu = gpus[local_rank % len(gpus)]
        tf.config.experimental.set_memory_growth(gpu, True)
        tf.config.set_visible_devices(gpu, "GPU")
        device = f"GPU:{local_rank % len(gpus)}"
    else:
        device = "CPU"
    n = threads or default_threads(local_size)
    tf.config.threading.set_intra_op_parallelism_threads(n)
    tf.config.threading.set_inter_op_parallelism_threads(max(1, min(2, n)))
    return Devices(device, n, len(gpus))


def gpu_problem(
    gpus_per_worker: int, local_size: int, gpus_found: int, missing_libraries: Sequence[str]
) -> str | None:
    """Why a job asking for `gpus_per_worker` (> 0) GPUs per worker cannot train on this rank's
    host (the CUDA libraries TensorFlow cannot load, the GPUs it found, one per local rank), or
    None."""
    asked = f"this job asked for {gpus_per_worker} GPU(s) per worker"
    if missing_libraries:
        return (
            f"{asked}, but the trainer runs in a CPU image: TensorFlow cannot load "
            f"{', '.join(missing_libraries)}. Use the GPU trainer image "
            f"({IMAGE_NAMES['trainer_gpu']}, which gpus_per_worker > 0 selects unless "
            "trainer_image names another), or set gpus_per_worker to 0 to train on the CPU"
        )
    if gpus_found == 0:
        return (
            f"{asked}, but this rank sees no GPU (TensorFlow found none: no GPU was given to the "
            "pod or container, or its driver is missing). Check the worker's nvidia.com/gpu "
            "limit and the node's NVIDIA device plugin, or set gpus_per_worker to 0"
        )
    if gpus_found < local_size:
        return (
            f"{asked}, but this rank's host shows {gpus_found} GPU(s) for its {local_size} local "
            f"ranks, which need one each: give each worker at least slots_per_worker GPUs "
            f"(gpus_per_worker >= {local_size})"
        )
    return None


def gpu_usage(tf: Any, devices: Devices) -> dict[str, Any]:
    """The rank's GPU for the run summary (its name, the peak memory TensorFlow allocated)."""
    if not devices.on_gpu:
        return {}
    gpu = tf.config.get_visible_devices("GPU")[0]
    details = tf.config.experimental.get_device_details(gpu)
    memory = tf.config.experimental.get_memory_info("GPU:0")  # the one visible GPU
    return {
        "gpu_name": str(details.get("device_name", "unknown GPU")),
        "gpu_peak_memory_bytes": int(memory["peak"]),
    }
