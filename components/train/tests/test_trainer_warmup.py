"""A real 3-rank job warming its learning rate up over 2 of its 3 epochs, and what it must show
(one job for the module, one claim per test): the learning rate of each epoch, as TensorBoard
shows it, follows the ``lr_scaling`` rule and Horovod's warmup; and every rank holds its
training input to the end (`components.train.rank.held_input`), seen from outside the trainer
(`input_at_exit.py`). (No warmup, epoch 1 at the scaled rate: test_trainer_job.)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.test_e2e_local import read_scalars

pytestmark = pytest.mark.horovod

WORKERS, EPOCHS, WARMUP_EPOCHS = 3, 3, 2
LEARNING_RATE = 0.002  # one rank's: not the default, so the rule's product is this job's


@pytest.fixture(scope="module")
def job(mnist_1000: str, tmp_path_factory: pytest.TempPathFactory, run_job: Any) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("warmup3")
    output, watch = root / "out", root / "input-at-exit"
    args = [
        *("--data", mnist_1000, "--output", str(output), "--workers", str(WORKERS)),
        *("--epochs", str(EPOCHS), "--warmup-epochs", str(WARMUP_EPOCHS)),
        *("--learning-rate", str(LEARNING_RATE), "--lr-scaling", "linear"),
        *("--batch-size-per-worker", "64", "--threads-per-worker", "1"),
        *("--model", "components.train.tests.user_model:per_rank_weights"),
    ]
    proc = run_job(WORKERS, args, input_at_exit=watch)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return {"proc": proc, "output": output, "watch": watch}


def documented_lr(epoch: int) -> float:
    """The learning rate at the end of `epoch` (counted from 1) by the documented rules alone:
    ``lr_scaling`` linear is one rank's rate x the ranks (Goyal et al. 2017); Horovod's
    LearningRateWarmupCallback starts at that rate / the ranks and grows linearly in the
    epochs done (each step adds its fraction of an epoch) to the full rate after
    ``warmup_epochs``, where it stays."""
    scaled = LEARNING_RATE * WORKERS
    done = min(epoch, WARMUP_EPOCHS)
    return scaled / WORKERS * (1 + done * (WORKERS - 1) / WARMUP_EPOCHS)


def test_each_epochs_learning_rate_follows_the_scaling_rule_and_the_warmup(
    job: dict[str, Any],
) -> None:
    """TensorBoard's ``learning_rate`` of each epoch (its last step's) is the rule's: 2/3 of
    0.006 after epoch 1, 0.006 once the warmup is over; the epoch lines say the same."""
    want = [documented_lr(epoch) for epoch in range(1, EPOCHS + 1)]
    assert want == pytest.approx([0.004, 0.006, 0.006])  # the rule, worked by hand
    board = read_scalars(job["output"] / "tensorboard")["train"]["learning_rate"]
    assert [step for step, _ in board] == [1, 2, 3]
    assert [lr for _, lr in board] == pytest.approx(want, rel=1e-6)
    out = job["proc"].stdout
    printed = [
        line.split(" - lr ")[1].split(" ")[0] for line in out.splitlines() if " - lr " in line
    ]
    assert printed == [f"{lr:.5f}" for lr in want], out


def test_every_rank_ends_with_its_training_input_held_never_destroyed(
    job: dict[str, Any],
) -> None:
    """Each rank's fit iterator is still alive at its last exit handler, past fit and the
    export, and the process ends without destroying it: no rank waits for tf.data's
    autotuning thread, neither when fit returns nor at exit (held_input's docstring)."""
    watch: Path = job["watch"]
    for rank in range(WORKERS):
        assert (watch / f"rank-{rank}.txt").read_text() == "alive 1\n", f"rank {rank}"
