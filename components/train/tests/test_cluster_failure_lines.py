"""A failed cluster job in the train step's log: each line the ranks share once, then one
``FAILED:`` line, no traceback and no second copy of the launcher log.

The real ``kubernetes`` client against kmock's API emulator, as the lifecycle tests
(test_trainjob_lifecycle.py); Kubeflow Trainer and the launcher pod's log are played through
the API by `standins.kmock_cluster.Operator`. The step's program runs under
`one_line_failures`, as the train component's executor runs it.
"""

from __future__ import annotations

import time

import pytest

from components.common.failure import EXIT_EXPECTED, one_line_failures
from components.train.cluster.params import job_name
from components.train.tests.cluster_jobs import POLL, make_params
from components.train.trainjob.lifecycle import run_trainjob
from standins.kmock_cluster import NS, TRAINJOB_KIND, Cluster, Operator

pytestmark = pytest.mark.timeout(120)

WHAT = f"TrainJob {NS}/{job_name('nightly', 'run-123')}"
SHARED = "WARNING: a library's warning every rank prints"
REASON = "4 of 4 ranks cannot train: kfp-horovod/data/manifest.json: missing"


def test_a_failed_trainjob_says_each_shared_line_once_and_fails_in_one_line(
    cluster: Cluster, bucket: str, capsys: pytest.CaptureFixture[str]
) -> None:
    def script(op: Operator) -> None:
        name = op.wait_for_job(timeout=60)  # a loaded machine creates the runtime slowly
        pod_name = op.launcher(name)
        op.say(pod_name, *[f"[1,{rank}]<stderr>:{SHARED}" for rank in range(4)])
        op.say(pod_name, f"[1,0]<stdout>:[rank 0/4] training failed: {REASON}")
        time.sleep(0.2)
        op.conditions(name, ("Failed", "FailedJobs", "jobset failed due to one job failure"))

    op = Operator(cluster, TRAINJOB_KIND)
    op.play(script)
    with pytest.raises(SystemExit) as exit_info, one_line_failures():
        run_trainjob(
            make_params(bucket), namespace=NS, api_client=cluster.api, poll_interval_s=POLL,
            log=print,
        )  # fmt: skip
    op.join()

    assert exit_info.value.code == EXIT_EXPECTED
    out = capsys.readouterr().out.splitlines()
    assert out[-1] == f"FAILED: {WHAT} failed: FailedJobs: jobset failed due to one job failure"
    assert [line for line in out if SHARED in line] == [f"[1,0]<stderr>:{SHARED}"]
    assert sum(REASON in line for line in out) == 1  # streamed once; the tail is not repeated
    assert not any("Traceback" in line or "launcher log ---" in line for line in out)
