"""The one ``mpirun`` command line of a static job, on this machine or across an MPIJob's pods.

Open MPI busy-polls while a rank waits for the others, and on a machine whose cores are all
computing that poll takes the CPU from TensorFlow: ``mpi_yield_when_idle`` makes a waiting rank
yield instead (measured in bench/README.md: the 2x1 job without it ran below Gloo's speed, with
it above). The rest is what Horovod's own ``horovodrun --mpi`` passes for Open MPI: output tagged
with each line's rank, no binding (the ranks size their own thread pools), slots filled in
order, and the ob1 point-to-point layer.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Sequence

# What a waiting rank does: yield the core instead of spinning on it.
YIELD_WHEN_IDLE = ("-mca", "mpi_yield_when_idle", "1")


class MPIRunMissing(RuntimeError):
    """There is no ``mpirun`` here (a local job needs Debian's Open MPI: make install)."""


def mpirun_command(
    world_size: int,
    program: Sequence[str],
    hosts: str | None = None,
    forward: Sequence[str] = (),
    workdir: str | None = None,
) -> list[str]:
    """``mpirun -np N ... PROGRAM``: `hosts` (``-H``; default: Open MPI's hostfile, which the
    MPIJob's launcher has), environment `forward`-ed to the ranks (``-x NAME`` or ``-x
    NAME=VALUE``: ranks started over ssh do not inherit the launcher's), their working
    directory."""
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    command = ["mpirun", "-np", str(world_size), "--tag-output"]
    if hosts:
        command += ["-H", hosts]
    command += ["-bind-to", "none", "-map-by", "slot", "-mca", "pml", "ob1", *YIELD_WHEN_IDLE]
    if workdir:
        command += ["-wdir", workdir]
    for name in forward:
        command += ["-x", name]
    return [*command, *program]


def local_mpirun_env(env: dict[str, str]) -> dict[str, str]:
    """`env` for an ``mpirun`` on this machine: as root (a CI machine, a container run as root)
    Open MPI refuses to start unless told that root is meant."""
    if os.geteuid() == 0:
        env.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
        env.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    return env


def require_mpirun() -> None:
    """Raise MPIRunMissing, naming the fix, unless ``mpirun`` is on the PATH."""
    if shutil.which("mpirun") is None:
        raise MPIRunMissing(
            "mpirun is not installed: local Horovod jobs run on Open MPI. `make install` "
            "installs Debian's (apt-get install openmpi-bin libopenmpi-dev) and builds Horovod "
            "with MPI"
        )
