"""Each rank's first check: is it in ONE Horovod job of the planned size, or one of N unrelated
copies? Runs in each rank, right after ``hvd.init()``. The symptom it names: an MPIJob whose N
processes each ran the script on its own, each in a world of 1, training its own model and
printing its own log lines.
"""

from __future__ import annotations


def world_size_problem(
    world_size: int, expected_workers: int, rank: int, fewest: int = 0
) -> str | None:
    """Why this job is not of the expected size, or None. An elastic job (`fewest` > 0) may
    have any size from `fewest` to `expected_workers`."""
    if world_size == expected_workers or fewest <= world_size <= expected_workers and fewest:
        return None
    failed = f"kfp-horovod preflight failed [rank {rank}/{world_size}]:"
    if fewest and world_size < fewest:
        return (
            f"{failed} this elastic Horovod job has {world_size} worker(s), fewer than its "
            f"minimum of {fewest} (--min-workers x --slots-per-worker); elastic horovodrun must "
            f"start it with --min-np {fewest}. Nothing was trained or written."
        )
    planned = f"{expected_workers} (--workers x --slots-per-worker)"
    if world_size < expected_workers:
        what = (
            f"This process is in a Horovod job of {world_size} worker(s), but the job was "
            f"started for {planned}. The processes that were started are independent copies, "
            "not one job: each would train its own model on all the data and print its own copy "
            "of every log line (the 'every line N times' symptom)."
        )
    else:
        what = (
            f"This Horovod job has {world_size} workers, but it was started for {planned}: more "
            "processes joined than were planned (check -np, the MPIJob's replicas and "
            "slotsPerWorker)."
        )
    n = expected_workers
    return (
        f"{failed} {what} Start exactly {n} processes as ONE job: locally `horovodrun -np {n} "
        f"-H localhost:{n} python -m components.train.rank ...`; on Kubernetes an MPIJob whose "
        f"launcher runs `horovodrun` or `mpirun -np {n}` across workers x slotsPerWorker (see "
        "`python -m pipeline render-mpijob`). Nothing was trained or written."
    )
