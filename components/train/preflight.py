"""Preflight: are we one Horovod job of the expected size, or N unrelated copies?

This is the failure in the original report: an MPIJob whose N processes each ran the training
script on its own, so every process had a world of size 1, trained its own model on all the
data, and printed its own copy of every log line.
"""

from __future__ import annotations

EXIT_PREFLIGHT = 3


def world_size_problem(world_size: int, expected_workers: int, rank: int) -> str | None:
    """A message explaining the mismatch, or None when the job has the expected size."""
    if world_size == expected_workers:
        return None
    tag = f"[rank {rank}/{world_size}]"
    if world_size < expected_workers:
        what = (
            f"This process is in a Horovod job of {world_size} worker(s), but "
            f"--expected-workers is {expected_workers}. The processes that were started are "
            "independent copies, not one job: each would train its own model on all the data and "
            "print its own copy of every log line (the 'every line N times' symptom)."
        )
    else:
        what = (
            f"This Horovod job has {world_size} workers, but --expected-workers is "
            f"{expected_workers}: more processes joined than were planned (check -np, the "
            "MPIJob's replicas and slotsPerWorker)."
        )
    how = (
        f"Start exactly {expected_workers} processes as ONE job: locally "
        f"`horovodrun -np {expected_workers} -H localhost:{expected_workers} python -m "
        "components.train ...`; on Kubernetes an MPIJob whose launcher runs `horovodrun` or "
        f"`mpirun -np {expected_workers}` across workers x slotsPerWorker (see "
        "`python -m pipeline render-mpijob`). Nothing was trained or written."
    )
    return f"kfp-horovod preflight failed {tag}: {what} {how}"
