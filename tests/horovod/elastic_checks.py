"""Horovod's elastic state as components/train/rank/elastic.py uses it: ``hvd.elastic.KerasState``
over the model, its Keras 3 DistributedOptimizer (which the state builds, so its slots are
committed and synced from the start) and the job's own records;
``hvd.elastic.run``, whose sync broadcasts rank 0's state; ``CommitStateCallback`` committing
at epoch ends only; and restore, which gives back what the last commit saved.

(A reset after a lost worker, which restores through ``hvd.elastic.run`` and re-forms the
world, is tested with real lost ranks by components/train/tests/test_trainer_elastic.py.)
"""

from __future__ import annotations

from typing import Any

from components.train.rank.elastic import COMMIT_AT_EPOCH_ENDS_ONLY
from tests.horovod.common import (
    Check,
    Rank,
    compile_distributed,
    dataset,
    flat,
    optimizer_state,
    resume_optimizer,
    small_model,
)

LEARNING_RATE = 0.01


def _trainee(me: Rank, seed: int, **records: Any) -> tuple[Any, Any, Any]:
    """A compiled model, its optimizer and their ``KerasState`` with `records`, as
    train_elastic builds them; the state builds the Keras 3 optimizer (its first step would),
    so every slot is in what it commits and syncs."""
    model = small_model(me.keras, seed)
    optimizer = compile_distributed(me, model, me.keras.optimizers.Adam(LEARNING_RATE))
    state = me.hvd.elastic.KerasState(model, optimizer, **records)
    assert optimizer.built, "KerasState did not build the Keras 3 optimizer"
    return model, optimizer, state


def _snapshot(model: Any, optimizer: Any, state: Any) -> dict[str, Any]:
    return {
        "weights": flat(model.get_weights()),
        "optimizer_state": optimizer_state(optimizer),
        "epoch": state.epoch,
        "metrics": state.metrics,
        "epochs": state.epochs,
    }


def _assert_same_state(got: dict[str, Any], want: dict[str, Any]) -> None:
    for key, value in got.items():
        assert value == want[key], f"{key} = {str(value)[:200]}, not {str(want[key])[:200]}"


def state_sync(me: Rank) -> dict[str, Any]:
    """``hvd.elastic.run``'s sync before the first attempt: ranks that hold different weights,
    optimizer state (iterations, learning rate, moments) and records all hold rank 0's in the
    attempt."""
    held = []
    for rank in range(me.size):  # what every rank holds; this rank runs its own
        records = {"epoch": 3 + rank, "metrics": {"loss": float(rank)}, "epochs": [{"rank": rank}]}
        model, optimizer, state = _trainee(me, seed=100 + rank, **records)
        resume_optimizer(optimizer, model, rank)
        held.append((model, optimizer, state))
    before = [_snapshot(*h) for h in held]
    model, optimizer, state = held[me.rank]

    @me.hvd.elastic.run  # type: ignore[misc]
    def attempt(state: Any) -> dict[str, Any]:
        return _snapshot(model, optimizer, state)

    synced = attempt(state)
    for key in before[0]:
        assert before[1][key] != before[0][key], f"the ranks must start with different {key}"
    _assert_same_state(synced, before[0])
    return {}


def commit_callback(me: Rank) -> dict[str, Any]:
    """``CommitStateCallback(state, COMMIT_AT_EPOCH_ENDS_ONLY)`` after a record-the-epoch
    callback (elastic._attempt), in ``fit`` inside ``hvd.elastic.run``: it commits once
    per epoch, after the record. A restore after an uncommitted step then gives back the
    committed weights, optimizer state and records (restored by ``hvd.elastic.run`` after a
    lost worker)."""
    hvd, keras = me.hvd, me.keras
    model, optimizer, state = _trainee(me, seed=7, epoch=0, metrics={}, epochs=[])
    commits: list[int] = []
    commit = state.commit

    def counted() -> None:
        commits.append(state.epoch)
        commit()

    state.commit = counted

    class RecordEpoch(keras.callbacks.Callback):  # type: ignore[misc, name-defined]
        def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
            state.epochs = [*state.epochs, {"epoch": epoch + 1, "world_size": me.size}]
            state.metrics = {k: float(v) for k, v in (logs or {}).items()}
            state.epoch = epoch + 1

    @hvd.elastic.run  # type: ignore[misc]
    def attempt(state: Any) -> dict[str, Any]:
        callbacks = [
            hvd.callbacks.MetricAverageCallback(),
            RecordEpoch(),
            hvd.elastic.CommitStateCallback(state, COMMIT_AT_EPOCH_ENDS_ONLY),
        ]
        model.fit(dataset(me, 3), epochs=2, steps_per_epoch=3, callbacks=callbacks, verbose=0)
        return _snapshot(model, optimizer, state)

    trained = attempt(state)
    # An uncommitted step and epoch (records assigned, never mutated, as elastic.py does).
    model.set_weights([w + 1.0 for w in model.get_weights()])
    for var in optimizer.variables:  # iterations, learning rate, moments
        var.assign(var + 1)
    state.epoch, state.metrics = 3, {"loss": 0.25}
    state.epochs = [*state.epochs, {"epoch": 3, "world_size": me.size}]
    changed = _snapshot(model, optimizer, state)
    state.restore()
    assert commits == [1, 2], f"committed at epochs {commits}"
    assert [e["epoch"] for e in trained["epochs"]] == [1, 2] and trained["epoch"] == 2, trained
    for key in trained:
        assert changed[key] != trained[key], f"{key} was not changed after the commit"
    _assert_same_state(_snapshot(model, optimizer, state), trained)
    return {"same": {"trained": trained}}


CHECKS: dict[str, Check] = {
    "elastic_state_sync": state_sync,
    "elastic_commit_callback": commit_callback,
}
