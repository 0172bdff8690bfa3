"""A rank for the watch's tests under real mpirun: it beats as the trainer's ranks do, prints
``rank <r> pid <pid>``, then ``sleep S CODE`` (sleep, beating, exit CODE) or ``freeze R`` (rank
R stops itself after its first beat; the others sleep 120 s)."""

import os
import signal
import sys
import time

from components.train import mpiwatch

mpiwatch.start_from_env()
rank = int(os.environ["OMPI_COMM_WORLD_RANK"])
action, arg = sys.argv[1], float(sys.argv[2]) if len(sys.argv) > 2 else 0.0


# One write per line: mpirun's --tag-output tags each write (print writes the newline apart).
sys.stdout.write(f"rank {rank} pid {os.getpid()}\n")
sys.stdout.flush()
if action == "sleep":
    time.sleep(arg)
    sys.exit(int(sys.argv[3]))
elif action == "freeze":
    if rank == int(arg):
        time.sleep(0.3)  # at least one beat out first
        os.kill(os.getpid(), signal.SIGSTOP)
    time.sleep(120)
else:
    sys.exit(f"beating_rank.py: unknown action {action!r}")
