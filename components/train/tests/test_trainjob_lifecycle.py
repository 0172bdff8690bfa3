"""What only the TrainJob backend has, with the real ``kubernetes`` client against kmock's API
emulator as in test_cluster_lifecycle.py (which refuses its elastic job): its runtime (made
once, shared, refused when changed), and a failed TrainJob in the train step's log: each line
the ranks share once, then one ``FAILED:`` line, no traceback and no second copy of the
launcher log (the step's program runs under `one_line_failures`, as its executor runs it).
The real trainer from the stored TrainJob's command: tests/test_pipeline_trainjob.py.
"""

from __future__ import annotations

import copy
import time

import pytest

from components.common.failure import EXIT_EXPECTED, one_line_failures
from components.train.cluster.job import SPEC_ANNOTATION, JobError, job_name
from components.train.cluster.trainjob import TRAINING_RUNTIME, TRAINJOB
from components.train.tests.cluster_jobs import KINDS, NAME, complete, make_params, pair, posts, run
from standins.kmock_cluster import NS, Cluster, Operator

pytestmark = pytest.mark.timeout(120)

WHAT = f"TrainJob {NS}/{job_name('nightly', 'run-123')}"
SHARED = "WARNING: a library's warning every rank prints"
REASON = "4 of 4 ranks cannot train: kfp-horovod/data/manifest.json: missing"


def test_a_failed_trainjob_says_each_shared_line_once_and_fails_in_one_line(
    cluster: Cluster, gcs_uri: str, capsys: pytest.CaptureFixture[str]
) -> None:
    def script(op: Operator) -> None:
        name = op.wait_for_job()  # however slowly a loaded machine creates the runtime
        pod_name = op.launcher(name)
        op.say(pod_name, *[f"[1,{rank}]<stderr>:{SHARED}" for rank in range(4)])
        op.say(pod_name, f"[1,0]<stdout>:[rank 0/4] training failed: {REASON}")
        time.sleep(0.2)
        op.conditions(name, ("Failed", "FailedJobs", "jobset failed due to one job failure"))

    op = Operator(cluster, KINDS["trainjob"])
    op.play(script)
    with pytest.raises(SystemExit) as exit_info, one_line_failures():
        run(cluster, pair("trainjob")[0], make_params(gcs_uri), print)
    op.join()

    assert exit_info.value.code == EXIT_EXPECTED
    out = capsys.readouterr().out.splitlines()
    assert out[-1] == f"FAILED: {WHAT} failed: FailedJobs: jobset failed due to one job failure"
    assert [line for line in out if SHARED in line] == [f"[1,0]<stderr>:{SHARED}"]
    assert sum(REASON in line for line in out) == 1  # streamed once; the tail is not repeated
    assert not any("Traceback" in line or "launcher log ---" in line for line in out)


def test_the_runtime_is_created_when_absent_reused_when_present_refused_when_changed(
    cluster: Cluster, gcs_uri: str
) -> None:
    b, kind = pair("trainjob")
    p, lines = make_params(gcs_uri), []
    runtime = b.build(p, NS)[0]
    op = Operator(cluster, kind)
    op.play(lambda op: complete(op, NAME, op.start(op.wait_for_job())))
    run(cluster, b, p, lines.append)
    op.join()
    stored = cluster.job(runtime["metadata"]["name"], TRAINING_RUNTIME)
    assert stored is not None and stored["spec"] == runtime["spec"]
    assert lines[0] == f"created TrainingRuntime {NS}/{runtime['metadata']['name']}"

    # another run with the same settings shares the runtime: no second create
    other = make_params(gcs_uri, run_name="weekly", pipeline_run_id="run-456")
    assert b.build(other, NS)[0] == runtime
    weekly = job_name("weekly", "run-456")
    op.play(lambda op: complete(op, weekly, op.start(op.wait_for_job(name=weekly))))
    lines.clear()
    run(cluster, b, other, lines.append)
    op.join()
    assert posts(cluster, TRAINING_RUNTIME) == 1
    assert lines[0] == f"using TrainingRuntime {NS}/{runtime['metadata']['name']}"
    assert sorted(cluster.job_names(TRAINJOB)) == sorted([NAME, weekly])

    # someone edited it: no TrainJob on a runtime that is not ours
    changed = copy.deepcopy(runtime)
    changed["metadata"]["annotations"][SPEC_ANNOTATION] = "0" * 64
    cluster.custom.patch_namespaced_custom_object(
        TRAINING_RUNTIME.group, TRAINING_RUNTIME.version, NS, TRAINING_RUNTIME.plural,
        runtime["metadata"]["name"], {"metadata": changed["metadata"]},
    )  # fmt: skip
    third = make_params(gcs_uri, run_name="third")
    with pytest.raises(JobError, match="exists but was not made from this spec"):
        run(cluster, b, third, lambda _: None)
    assert posts(cluster, TRAINJOB) == 2
