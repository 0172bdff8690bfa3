"""Static local jobs pin each rank's Horovod background thread to its own core (the
``HOROVOD_THREAD_AFFINITY`` lever, adopted as the launcher's default)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from components.train import launch

# Each rank: after hvd.init(), the CPUs each of its threads may run on.
RANK_PROGRAM = """
import glob, json, sys, horovod.tensorflow as hvd
hvd.init()
allowed = []
for status in glob.glob('/proc/self/task/*/status'):
    for line in open(status):
        if line.startswith('Cpus_allowed_list:'):
            allowed.append(line.split()[1])
# one write, one line: mpirun tags each chunk a rank writes (print writes text and newline apart)
sys.stdout.write(f"AFFINITY {hvd.local_rank()} {json.dumps(sorted(set(allowed)))}\\n")
sys.stdout.flush()
"""


def test_the_affinity_lists_one_core_per_local_rank(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {2, 5})
    assert launch.thread_affinity(3) == "2,5,2"
    assert launch.job_environment({}, 2)["HOROVOD_THREAD_AFFINITY"] == "2,5"
    assert "HOROVOD_THREAD_AFFINITY" not in launch.job_environment({})  # not a local job
    mine = {"HOROVOD_THREAD_AFFINITY": "7,7"}
    assert launch.job_environment(mine, 2)["HOROVOD_THREAD_AFFINITY"] == "7,7"  # the user's


@pytest.mark.horovod
def test_each_ranks_background_thread_runs_on_its_own_core() -> None:
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        pytest.fail("this test needs 2 cores (the project's machines have 2)")
    command = launch.static_command(2, [sys.executable, "-c", RANK_PROGRAM])  # mpirun
    done = subprocess.run(
        command, capture_output=True, text=True, timeout=120, env=launch.job_environment(None, 2)
    )
    assert done.returncode == 0, done.stdout + done.stderr
    seen = {}
    for line in done.stdout.splitlines():
        if "AFFINITY" in line:
            rank, allowed = line.split("AFFINITY ")[1].split(" ", 1)
            seen[int(rank)] = allowed
    # one thread of rank r (Horovod's background thread) is confined to core r
    assert f'"{cores[0]}"' in seen[0] and f'"{cores[1]}"' in seen[1], seen
    assert f'"{cores[1]}"' not in seen[0] and f'"{cores[0]}"' not in seen[1], seen
