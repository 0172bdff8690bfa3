"""Pin this Horovod rank to its own cores, then run the given command in its place.

``horovodrun ... python -m bench.pin THREADS -- python -m components.train ...``: local rank r
gets cores ``[r*THREADS, (r+1)*THREADS)`` of those this process may use, so N ranks of T threads
each get N*T distinct cores. Without pinning, a "1 thread" TensorFlow process still runs its
Python loop and input pipeline on other threads and spreads over every core.
"""

from __future__ import annotations

import os
import sys


def cores_for(local_rank: int, threads: int, available: list[int]) -> set[int]:
    """The cores of `local_rank` when every rank gets `threads` of `available` (wrapping)."""
    if threads < 1 or not available:
        raise ValueError("need threads >= 1 and at least one core")
    return {available[(local_rank * threads + i) % len(available)] for i in range(threads)}


def main(argv: list[str] | None = None) -> int:
    """Pin by ``HOROVOD_LOCAL_RANK`` (set by horovodrun for each rank) and exec the command."""
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) < 3 or argv[1] != "--":
        print("usage: python -m bench.pin THREADS -- COMMAND...", file=sys.stderr)
        return 2
    local_rank = int(os.environ.get("HOROVOD_LOCAL_RANK", "0"))
    available = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, cores_for(local_rank, int(argv[0]), available))
    os.execvp(argv[2], argv[2:])


if __name__ == "__main__":
    sys.exit(main())
