"""Device placement, threads per process, and the refusals of a job that asked for GPUs. The GPU
path runs the real TensorFlow with only its device API standing in for a host with GPUs
(`components.train.tests.gpu_host`: no GPU here); the CPU path runs the real TensorFlow; both in
a subprocess (threads are set before TF starts). The thread override and a quiet rank's stderr
drive a ``tf`` stand-in; real refusals: test_trainer_bad_input.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from unittest.mock import MagicMock

import pytest

from components.train.rank.devices import (
    Devices,
    configure_devices,
    cpu_quota,
    default_threads,
    gpu_problem,
    gpu_usage,
)


def _tf(gpus: list[str]) -> MagicMock:
    """``tf`` on a host with `gpus`, as far as the thread settings and the CPU path use it."""
    tf = MagicMock()
    tf.config.list_physical_devices.side_effect = lambda kind: gpus if kind == "GPU" else []
    return tf


GPU_PATH = """
import json, tensorflow as tf
from components.train.rank.devices import configure_devices, gpu_usage
from components.train.tests.gpu_host import Gpu, install
GIB = 2**30
for local_rank in range(4):  # each rank starts TensorFlow in its own process on the host
    host = install(tf, [Gpu({"device_name": f"model {i}"}, (i + 1) * GIB) for i in range(3)]
                   + [Gpu({"compute_capability": (9, 0)}, 4 * GIB)])  # no name: some devices
    d = configure_devices(tf, local_rank, 4, None)
    print(json.dumps({
        "device": d.device, "gpus_found": d.gpus_found, "threads": d.threads,
        "visible": [g.name for g in host.visible], "growth": sorted(host.growth),
        "usage": gpu_usage(tf, d),
        "tf_threads": [tf.config.threading.get_intra_op_parallelism_threads(),
                       tf.config.threading.get_inter_op_parallelism_threads()],
    }))
"""


def test_each_process_is_pinned_to_the_gpu_of_its_local_rank_and_reports_that_one() -> None:
    """The real TensorFlow with its device API showing 4 GPUs (`gpu_host`; no GPU here): local
    rank r sees only the host's GPU r, grows its memory on that one only, sets TensorFlow's
    own thread pools to its share of the cores, and reports the name and peak memory of GPU r,
    which TensorFlow numbers GPU:0 once it is the only one visible."""
    out = subprocess.run(
        [sys.executable, "-c", GPU_PATH], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    ranks = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    threads = default_threads(4)
    for r, rank in enumerate(ranks):
        assert rank == {
            "device": f"GPU:{r}",
            "gpus_found": 4,
            "threads": threads,
            "visible": [f"/physical_device:GPU:{r}"],
            "growth": [f"/physical_device:GPU:{r}"],
            "usage": {
                "gpu_name": f"model {r}" if r < 3 else "unknown GPU",
                "gpu_peak_memory_bytes": (r + 1) * 2**30,
            },
            "tf_threads": [threads, max(1, min(2, threads))],
        }
    assert len(ranks) == 4
    assert gpu_usage(_tf([]), configure_devices(_tf([]), 0, 1, 1)) == {}  # a CPU rank: none


@pytest.mark.parametrize(("threads", "inter"), [(3, 2), (1, 1), (4, 2)])
def test_the_thread_override_wins_and_inter_op_threads_are_min_2_intra(
    threads: int, inter: int
) -> None:
    tf = _tf([])
    assert configure_devices(tf, 0, 2, threads) == Devices("CPU", threads, 0)
    tf.config.threading.set_intra_op_parallelism_threads.assert_called_once_with(threads)
    tf.config.threading.set_inter_op_parallelism_threads.assert_called_once_with(inter)


def test_a_job_that_asked_for_gpus_is_refused_unless_each_rank_has_one() -> None:
    assert gpu_problem(1, 1, 1, []) is None
    assert gpu_problem(2, 2, 2, []) is None
    cpu_image = gpu_problem(1, 1, 0, ["libcudart.so.12", "libcudnn.so.9"])
    assert cpu_image is not None
    assert "runs in a CPU image: TensorFlow cannot load libcudart.so.12, libcudnn.so.9" in cpu_image
    assert "kfp-horovod-trainer-gpu" in cpu_image
    no_gpu = gpu_problem(1, 1, 0, [])
    assert no_gpu is not None and "this rank sees no GPU" in no_gpu
    too_few = gpu_problem(1, 2, 1, [])
    assert too_few is not None
    assert "shows 1 GPU(s) for its 2 local ranks, which need one each" in too_few


@pytest.mark.parametrize("quiet", [False, True], ids=["rank 0", "another rank"])
def test_cpu_run_uses_the_real_tensorflow_settings(quiet: bool) -> None:
    """The real TensorFlow on this host without a GPU driver: a CPU rank, its threads set, and
    TensorFlow's "failed call to cuInit" line from rank 0 only."""
    code = f"""
import json, tensorflow as tf
from components.train.rank.devices import configure_devices
d = configure_devices(tf, 0, 1, 1, quiet={quiet})
print(json.dumps([d.device, d.threads, tf.config.threading.get_intra_op_parallelism_threads()]))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.strip().splitlines()[-1]) == ["CPU", 1, 1]
    assert ("failed call to cuInit" in out.stderr) is not quiet, out.stderr


def test_a_quiet_rank_passes_on_every_other_line_tensorflow_writes(
    capfd: pytest.CaptureFixture[str],
) -> None:
    def noisy(kind: str) -> list[str]:
        os.write(2, b"E cuda_driver.cc:152] failed call to cuInit: UNKNOWN ERROR (303)\n")
        os.write(2, b"W something else TensorFlow says\n")
        return []

    tf = _tf([])
    tf.config.list_physical_devices.side_effect = noisy
    configure_devices(tf, 0, 1, 1, quiet=True)
    assert capfd.readouterr().err == "W something else TensorFlow says\n"


V1 = "cpu/cpu.cfs_quota_us", "cpu/cpu.cfs_period_us"


@pytest.mark.parametrize(
    ("files", "quota"),
    [
        ({}, None),
        ({"cpu.max": "100000 100000\n"}, 1.0),
        ({"cpu.max": "50000 100000\n"}, 0.5),
        ({"cpu.max": "max 100000\n"}, None),
        ({V1[0]: "200000\n", V1[1]: "100000\n"}, 2.0),
        ({V1[0]: "-1\n", V1[1]: "100000\n"}, None),
    ],
    ids=["none", "v2-1", "v2-half", "v2-max", "v1-2", "v1-unlimited"],
)
def test_threads_split_the_cores_among_local_ranks_capped_by_the_cpu_limit(
    tmp_path: Path, files: dict[str, str], quota: float | None
) -> None:
    """A CPU limit caps the threads whatever the visible cores (the container tests check a real
    ``--cpus``)."""
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert cpu_quota(tmp_path) == quota
    cores = len(os.sched_getaffinity(0))
    usable = cores if quota is None else min(cores, int(quota))
    assert default_threads(1, tmp_path) == max(1, usable)  # never zero, a fraction rounds down
    assert default_threads(2, tmp_path) == max(1, usable // 2)
    assert default_threads(cores * 4, tmp_path) == 1
