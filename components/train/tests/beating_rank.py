"""A rank for the watch's tests, run by real mpirun: it beats as the trainer's ranks do
(`components.train.mpiwatch.start_from_env`, first thing), prints ``rank <r> pid <pid>``, then
does what argv says (the rank is ``OMPI_COMM_WORLD_RANK``):

- ``sleep S CODE``: sleep S seconds, beating, and exit CODE.
- ``freeze R``: rank R stops itself (SIGSTOP) after its first beat; the others sleep 120 s.

Test helper only.
"""

import os
import signal
import sys
import time

from components.train import mpiwatch

mpiwatch.start_from_env()
rank = int(os.environ["OMPI_COMM_WORLD_RANK"])
action, arg = sys.argv[1], float(sys.argv[2]) if len(sys.argv) > 2 else 0.0


def say(text: str) -> None:
    """One write per line: mpirun's --tag-output tags each write, so print's separate write of
    the newline would get a tag of its own."""
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


say(f"rank {rank} pid {os.getpid()}")
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
