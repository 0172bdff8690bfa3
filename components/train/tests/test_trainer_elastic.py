"""Elastic jobs (``min_workers`` > 0) with real elastic ``horovodrun``: a lost rank, a new slot.

No part of Horovod is mocked. The local launcher lists one name of this machine per slot
(`launch.LOOPBACK_NAMES`), so the rank killed here takes only its own "host" out of the job.
"""

from __future__ import annotations

import json
import os
import re
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from components.common import keras_env
from components.data_prep.prep import prepare
from components.train.config import TrainConfig
from components.train.launcher.launch import LocalHosts, run_local
from components.train.rank import checkpoints
from standins.commands import rank_processes
from standins.waiting import Background, wait_until

pytestmark = pytest.mark.horovod

EPOCHS = 5
WENT_ON_AT_TWO = "the job goes on as ONE job of 2 workers"  # elastic.py's line on a loss


@pytest.fixture(scope="module")
def mnist_3000(tmp_path_factory: pytest.TempPathFactory) -> str:
    """3,000 real digits: 1,000 per rank at 3 ranks, 1,500 at 2 (a few seconds an epoch)."""
    out = tmp_path_factory.mktemp("data") / "mnist-3000"
    prepare("bundled", str(out), shard_size=1000, data_limit=3000)
    return str(out)


def _checkpointed(out: Path) -> int:
    """The epoch of rank 0's latest checkpoint (0: none yet)."""
    return checkpoints.committed(str(out / "checkpoints"))


def test_a_killed_rank_leaves_one_job_of_two_and_a_new_slot_grows_it_back(
    mnist_3000: str, tmp_path: Path
) -> None:
    """3 ranks; rank 1 SIGKILLed 0.3 s into epoch 2: the other 2 go on as one job; once it has
    checkpointed, a 4th name is listed (the killed rank's stays blacklisted): back to 3."""
    out = tmp_path / "out"
    lines: list[str] = []
    hosts = LocalHosts(tmp_path / "hosts")
    hosts.directory.mkdir()
    hosts.offer(3)
    killed: list[int] = []
    ended = threading.Event()

    def while_it_runs(event: Callable[[], bool], what: str) -> None:
        wait_until(event, what, alive=lambda: not ended.is_set(), poll_s=0.05)

    def kill_rank_1_then_grow() -> None:
        while_it_runs(lambda: _checkpointed(out) >= 1, "epoch 1's checkpoint")
        time.sleep(0.3)  # into the next epoch
        proc = rank_processes(os.getpid())[1]  # the launcher watch's own lookup
        killed.append(proc.pid)
        proc.send_signal(signal.SIGKILL)
        while_it_runs(lambda: any(WENT_ON_AT_TWO in line for line in lines), WENT_ON_AT_TWO)
        done = _checkpointed(out)
        while_it_runs(lambda: _checkpointed(out) > done, "a checkpoint of the job of 2")
        hosts.offer(4)

    keras_env.tensorflow()  # imported now (`_checkpointed` reads with it), not in the watcher
    watcher = Background(kill_rank_1_then_grow, "the test's thread that kills rank 1")
    config = TrainConfig(
        data=mnist_3000,
        output=str(out),
        workers=3,
        min_workers=2,
        epochs=EPOCHS,
        batch_size_per_worker=16,
        threads_per_worker=1,
        model="small",
    )
    try:
        code = run_local(config, timeout_s=400, log=lines.append, hosts=hosts)
    finally:
        ended.set()
    assert code == 0, "\n".join(lines)
    watcher.join()  # it raises if the job ended before it killed rank 1 and offered a slot
    assert killed, "rank 1 was never killed"
    # exactly one model from rank 0, identical weights, every epoch logged once, each covered
    # exactly once at the world size it ran with
    assert [p.parent for p in out.rglob("saved_model.pb")] == [out / "model"]
    summary = json.loads((out / "run_summary.json").read_text())
    assert summary["world_size"] == 3 and len(summary["per_rank"]) == 3
    assert summary["weights_identical_across_ranks"] is True
    assert len({r["weights_sha256"] for r in summary["per_rank"]}) == 1
    logged = [int(n) for n in re.findall(rf"\] Epoch (\d+)/{EPOCHS} ", "\n".join(lines))]
    assert logged == list(range(1, EPOCHS + 1)), lines
    records = summary["elastic"]["epochs"]
    assert [r["epoch"] for r in records] == list(range(1, EPOCHS + 1))
    assert all(r["disjoint"] and r["covers_all"] and r["seen_per_epoch"] == 3000 for r in records)
    assert summary["coverage"]["covers_all"] and summary["coverage"]["epochs_checked"] == EPOCHS
    history = summary["elastic"]["world_size_history"]
    assert [h["world_size"] for h in history] == [3, 2, 3], history
    assert "worker was lost" in history[1]["why"] and "hosts changed" in history[2]["why"]
    shrunk, grown = history[1]["epoch"], history[2]["epoch"]
    assert 1 <= shrunk < grown < EPOCHS, history
    sizes = [r["world_size"] for r in records]
    assert sizes == [3] * shrunk + [2] * (grown - shrunk) + [3] * (EPOCHS - grown), sizes
    assert any(WENT_ON_AT_TWO in line for line in lines)
