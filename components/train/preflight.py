"""Preflight: what must hold before any rank trains.

- `world_size_problem` (every rank, first thing): are we one Horovod job of the expected size,
  or N unrelated copies? This is the failure in the original report: an MPIJob whose N
  processes each ran the training script on its own, so every process had a world of size 1,
  trained its own model on all the data, and printed its own copy of every log line.
- `model_problem` (the launcher, once, before ``horovodrun`` or the MPIJob starts): does the
  ``model`` parameter name a model the trainer can build? A typo in a user's entry point is one
  clear message instead of one traceback per rank.
"""

from __future__ import annotations

from components.common.defaults import MODELS

EXIT_PREFLIGHT = 3


class PreflightError(ValueError):
    """A launcher's preflight failed; nothing was started."""


def world_size_problem(
    world_size: int, expected_workers: int, rank: int, fewest: int = 0
) -> str | None:
    """A message explaining the mismatch, or None when the job has the expected size.

    An elastic job (`fewest` > 0) may have any size from `fewest` to `expected_workers`.
    """
    if world_size == expected_workers or fewest <= world_size <= expected_workers and fewest:
        return None
    if fewest and world_size < fewest:
        return (
            f"kfp-horovod preflight failed [rank {rank}/{world_size}]: this elastic Horovod job "
            f"has {world_size} worker(s), fewer than its minimum of {fewest} (--min-workers x "
            "--slots-per-worker); elastic horovodrun must start it with --min-np "
            f"{fewest}. Nothing was trained or written."
        )
    tag = f"[rank {rank}/{world_size}]"
    if world_size < expected_workers:
        what = (
            f"This process is in a Horovod job of {world_size} worker(s), but the job was "
            f"started for {expected_workers} (--workers x --slots-per-worker). The processes "
            "that were started are "
            "independent copies, not one job: each would train its own model on all the data and "
            "print its own copy of every log line (the 'every line N times' symptom)."
        )
    else:
        what = (
            f"This Horovod job has {world_size} workers, but it was started for "
            f"{expected_workers} (--workers x --slots-per-worker): more processes joined than "
            "were planned (check -np, the "
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


def model_problem(model: str) -> str | None:
    """Why the trainer cannot train `model`, or None; checked before any rank starts.

    A built-in name needs no more than its spelling (and no TensorFlow here). An entry point
    ``package.module:function`` is imported and built once, here, as every rank would build it,
    and checked: a Keras model, the trainer's input and output shapes, probabilities out
    (``components.train.model.check_model``).
    """
    from components.common.declare import model_problem as form_problem

    problem = form_problem(model)
    if problem is None and model not in MODELS:
        from components.train.model import ModelChoiceError, check_model

        try:
            check_model(model)
        except ModelChoiceError as exc:
            problem = str(exc)
    if problem is None:
        return None
    return f"kfp-horovod preflight failed: {problem}. No rank was started."


def check_model_before_launch(model: str) -> None:
    """Raise PreflightError if `model` cannot be trained (`model_problem`)."""
    problem = model_problem(model)
    if problem:
        raise PreflightError(problem)
