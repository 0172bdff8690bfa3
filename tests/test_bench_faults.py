"""The fault benchmark's trial counts: the elastic loss gets 10 trials in a full run (its
recovery stalled in 1 to 2 of 3 before Gloo's timeout was bounded; docs/reliability.md shows
all 10), every other fault `--repeats`; a quick run, one of each."""

from __future__ import annotations

from bench import faults


def test_the_elastic_loss_runs_ten_trials_in_a_full_run() -> None:
    assert faults.trials("elastic_sigkill", 3, quick=False) == 10
    assert faults.trials("static_sigkill", 3, quick=False) == 3
    assert faults.trials("elastic_sigkill", 12, quick=False) == 12  # more when asked
    assert {faults.trials(name, 3, quick=True) for name in faults.RUNNERS} == {1}
