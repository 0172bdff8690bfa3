"""A rank for the mpiwatch tests, run by real mpirun: it beats as the trainer's ranks do
(`components.train.heartbeat.start_from_env`, first thing), then does what argv says.

Usage: ``python beating_rank.py ACTION [ARG]`` (the rank is ``OMPI_COMM_WORLD_RANK``):

- ``sleep S``: sleep S seconds, beating, and exit 0.
- ``exit CODE``: exit CODE at once.
- ``freeze R``: rank R stops itself (SIGSTOP) after its first beat; the others sleep 120 s.
- ``allreduce-wait S``: Horovod over MPI; rank 1 sleeps S seconds before the allreduce that
  rank 0 already waits in; both exit 0 after it.
- ``allreduce-freeze``: Horovod over MPI; rank 1 stops itself (SIGSTOP) before the allreduce
  that rank 0 waits in, forever (Horovod's stall check cannot end it).

Every rank first prints ``rank <r> pid <pid>``. Test helper only.
"""

import os
import signal
import sys
import time
from collections.abc import Callable

from components.train import heartbeat

heartbeat.start_from_env()
rank = int(os.environ["OMPI_COMM_WORLD_RANK"])
action, arg = sys.argv[1], (sys.argv[2] if len(sys.argv) > 2 else "0")


def say(text: str) -> None:
    """One write per line: mpirun's --tag-output tags each write, so print's separate write of
    the newline would get a tag of its own."""
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


say(f"rank {rank} pid {os.getpid()}")


def _allreduce_after(rank1: Callable[[], None]) -> None:
    from components.common import keras_env

    keras_env.keras()
    import horovod.tensorflow as hvd
    import tensorflow as tf

    hvd.init()
    say(f"rank {rank} joined a Horovod job of {hvd.size()}")
    if rank == 1:
        rank1()
    total = hvd.allreduce(tf.constant([1.0]), op=hvd.Sum)
    say(f"rank {rank} allreduce done: {float(total[0]):g}")


def _stop_self() -> None:
    os.kill(os.getpid(), signal.SIGSTOP)


if action == "sleep":
    time.sleep(float(arg))
elif action == "exit":
    sys.exit(int(arg))
elif action == "freeze":
    if rank == int(arg):
        time.sleep(0.3)  # at least one beat out first
        _stop_self()
    time.sleep(120)
elif action == "allreduce-wait":
    _allreduce_after(lambda: time.sleep(float(arg)))
elif action == "allreduce-freeze":
    _allreduce_after(_stop_self)
else:
    sys.exit(f"beating_rank.py: unknown action {action!r}")
