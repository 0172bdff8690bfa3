"""How many CPU threads a rank should use: the cores it may run on, capped by its CPU limit.

A Kubernetes CPU limit (Docker's ``--cpus``) is a CFS quota: it does not change the cores a
process sees (``os.sched_getaffinity``), only how long it may run on them. A rank that sizes
its thread pools by the visible cores on a 64-core node with a limit of 2 starts 64 threads
and is throttled. So the quota, where one is set, caps the count.
"""

from __future__ import annotations

import os
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")


def cpu_quota(cgroup_root: Path = CGROUP_ROOT) -> float | None:
    """The CPU limit of this process's cgroup in cores, or None if no limit is set.

    Reads cgroup v2 (``cpu.max``: ``"<quota> <period>"`` or ``"max <period>"``) or cgroup v1
    (``cpu/cpu.cfs_quota_us`` and ``cpu/cpu.cfs_period_us``; -1 means no limit), as a
    container sees its own cgroup at `cgroup_root`.
    """
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


def visible_cores() -> int:
    """The cores this process may be scheduled on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def default_threads(local_size: int, cgroup_root: Path = CGROUP_ROOT) -> int:
    """CPU threads per process: usable cores (visible, capped by the CPU limit) split among the
    `local_size` ranks of this host; never below 1. A fractional limit rounds down."""
    cores = visible_cores()
    quota = cpu_quota(cgroup_root)
    if quota is not None:
        cores = min(cores, int(quota))
    return max(1, cores // max(1, local_size))
