"""A real 2-rank job with ``--mixed-precision`` (Keras's mixed_float16, on the CPU here: slow,
so the job is tiny) whose rank 1 alone overflows its first step
(`user_model.rank_1_overflows_first`): without one skip-or-step decision on every rank, rank 1
would skip the step while rank 0 waited in its allreduce (a stall, then the job ends). It must
finish with identical weights and the same loss scale on both ranks, halved at least once.
"""

from __future__ import annotations

from typing import Any

import pytest

from components.train.summary import read

pytestmark = pytest.mark.horovod

INITIAL_SCALE = 2.0**15


def test_a_one_rank_overflow_is_skipped_by_every_rank(
    mnist_1000: str, tmp_path: Any, run_job: Any
) -> None:
    output = tmp_path / "out"
    flags = {
        "data": mnist_1000,
        "output": output,
        "workers": 2,
        "epochs": 1,
        "batch-size-per-worker": 100,
        "threads-per-worker": 1,
        "model": "components.train.tests.user_model:rank_1_overflows_first",
    }
    args = [*(f for k, v in flags.items() for f in (f"--{k}", str(v))), "--mixed-precision"]
    proc = run_job(2, args)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = read(str(output / "run_summary.json"))
    assert summary.config.mixed_precision is True
    assert summary.weights_identical_across_ranks is True
    scales = [r["loss_scale"] for r in summary.per_rank]
    assert len(set(scales)) == 1, f"the ranks' loss scales differ: {scales}"
    assert scales[0] <= INITIAL_SCALE / 2, f"rank 1's overflow did not halve the scale: {scales}"
