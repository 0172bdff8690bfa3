"""The launcher's log in the train step's log (`components.train.launcher.cluster.launcher_log`),
with
the real ``kubernetes`` client against kmock's API emulator: followed in one request while it
runs (test_cluster_lifecycle.py), and opened again where the stream ends before the container
does, each line printed once."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from components.train.tests.cluster_jobs import BOTH, NAME, complete, make_params, pair, run
from standins.kmock_cluster import Cluster, Operator

pytestmark = pytest.mark.timeout(120)  # the ceiling of every wait below: only a hang reaches it
EPOCHS = [f"[1,0]<stdout>:[rank 0/4] epoch {e}/4 loss 0.{9 - e}" for e in (1, 2, 3)]


def _until(done: Callable[[], bool]) -> None:
    while not done():
        time.sleep(0.02)


@BOTH
def test_a_stream_that_ends_while_the_launcher_runs_is_reopened_and_no_line_repeats(
    cluster: Cluster, gcs_uri: str, name: str
) -> None:
    b, kind = pair(name)
    lines: list[str] = []

    def script(op: Operator) -> None:
        pod_name = op.start(op.wait_for_job())
        op.say(pod_name, EPOCHS[0])
        _until(lambda: EPOCHS[0] in lines)
        cluster.end_log_streams()  # the container runs on
        op.say(pod_name, EPOCHS[1])
        _until(lambda: len(cluster.requests("GET", "/log")) == 2)  # opened again
        complete(op, NAME, pod_name, EPOCHS[2])

    op = Operator(cluster, kind)
    op.play(script)
    run(cluster, b, make_params(gcs_uri), lines.append)
    op.join()
    assert [line for line in lines if "epoch" in line] == EPOCHS
    assert len(cluster.requests("GET", "/log")) == 2
