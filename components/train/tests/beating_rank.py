"""A rank for the watch's tests under real mpirun: it beats as the trainer's ranks do, prints
``rank <r> pid <pid>``, then ``sleep S CODE`` (sleep, beating, exit CODE), ``freeze R`` (rank
R stops itself after its first beat; the others sleep 120 s) or ``busy R S CODE`` (rank R stops
beating after its first beat and computes for S s, as a rank holding Python's lock would; the
others sleep S s, beating; all exit CODE)."""

import os
import signal
import sys
import threading
import time

from components.train.rank import heartbeat

muted = threading.Event()  # set: this rank's beats are no longer written


def _write(text: str) -> None:
    if not muted.is_set():
        os.write(1, text.encode())


heartbeat.start_from_env(write=_write)
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
elif action == "busy":
    seconds = float(sys.argv[3])
    if rank == int(arg):
        time.sleep(0.3)  # at least one beat out first
        muted.set()
        end = time.monotonic() + seconds
        while time.monotonic() < end:  # it runs, and sends no beat
            pass
    else:
        time.sleep(seconds)
    sys.exit(int(sys.argv[4]))
else:
    sys.exit(f"beating_rank.py: unknown action {action!r}")
