"""What only the TrainJob backend has, with the real ``kubernetes`` client against kmock's API
emulator as in test_cluster_lifecycle.py (which refuses its elastic job): its runtime (made
once, shared, refused when changed), a failed TrainJob in the train step's log: each line
the ranks share once, then one ``FAILED:`` line, no traceback and no second copy of the
launcher log (the step's program runs under `one_line_failures`, as its executor runs it), and
the deadline on every Trainer a platform release ships: the TrainJob's own field from v2.2.0
on, the train step's on v2.1.0 (Kubeflow 26.03), whose TrainJob has no such field.
The real trainer from the stored TrainJob's command: tests/test_pipeline_trainjob.py.
"""

from __future__ import annotations

import copy
import json

import pytest

from components.common.failure import ExitCode, one_line_failures
from components.train.launcher.cluster.job import SPEC_ANNOTATION, ClusterJobError, job_name
from components.train.launcher.cluster.trainjob import TRAINING_RUNTIME, TRAINJOB
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
        op.end(name, 1)
        op.conditions(name, ("Failed", "FailedJobs", "jobset failed due to one job failure"))

    op = Operator(cluster, KINDS["trainjob"])
    op.play(script)
    with pytest.raises(SystemExit) as exit_info, one_line_failures():
        run(cluster, pair("trainjob")[0], make_params(gcs_uri), print)
    op.join()

    assert exit_info.value.code == ExitCode.RUN_FAILED
    printed = capsys.readouterr()
    out = printed.out.splitlines()
    assert printed.err.splitlines() == [
        f"FAILED: {WHAT} failed: FailedJobs: jobset failed due to one job failure"
    ]
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
    assert f"created TrainingRuntime {NS}/{runtime['metadata']['name']}" in lines

    # another run with the same settings shares the runtime: no second create
    other = make_params(gcs_uri, run_name="weekly", pipeline_run_id="run-456")
    assert b.build(other, NS)[0] == runtime
    weekly = job_name("weekly", "run-456")
    op.play(lambda op: complete(op, weekly, op.start(op.wait_for_job(name=weekly))))
    lines.clear()
    run(cluster, b, other, lines.append)
    op.join()
    assert posts(cluster, TRAINING_RUNTIME) == 1
    assert f"using TrainingRuntime {NS}/{runtime['metadata']['name']}" in lines
    assert sorted(cluster.job_names(TRAINJOB)) == sorted([NAME, weekly])

    # someone edited it: no TrainJob on a runtime that is not ours
    changed = copy.deepcopy(runtime)
    changed["metadata"]["annotations"][SPEC_ANNOTATION] = "0" * 64
    cluster.custom.patch_namespaced_custom_object(
        TRAINING_RUNTIME.group,
        TRAINING_RUNTIME.version,
        NS,
        TRAINING_RUNTIME.plural,
        runtime["metadata"]["name"],
        {"metadata": changed["metadata"]},
    )
    third = make_params(gcs_uri, run_name="third")
    with pytest.raises(ClusterJobError, match="exists but was not made from this spec"):
        run(cluster, b, third, lambda _: None)
    assert posts(cluster, TRAINJOB) == 2


TRAINERS = ["v2.1.0", "v2.2.0", "v2.3.0"]  # deploy/crd/trainer/
BY = {"v2.1.0": "step", "v2.2.0": "cluster", "v2.3.0": "cluster"}


@pytest.mark.parametrize("trainer", TRAINERS)
def test_the_trainjob_holds_only_fields_the_clusters_trainer_has_and_says_who_keeps_the_deadline(
    gcs_uri: str, trainer: str
) -> None:
    """The step reads the cluster's TrainJob schema (its OpenAPI v3 document) and sends the
    deadline field only where it exists; everything goes with Strict field validation."""
    b, kind = pair("trainjob")
    lines: list[str] = []
    with Cluster(trainer=trainer) as cluster:
        op = Operator(cluster, kind)
        op.play(lambda op: complete(op, NAME, op.start(op.wait_for_job())))
        summary = run(cluster, b, make_params(gcs_uri), lines.append)
        op.join()
        (post,) = cluster.requests("POST", "/trainjobs")
        assert cluster.requests("GET", "/openapi/v3/apis/trainer.kubeflow.org/v1alpha1")
    sent = json.loads(post.body)  # what the client sent, before any pruning
    assert post.params["fieldValidation"] == "Strict"
    assert ("activeDeadlineSeconds" in sent["spec"]) == (BY[trainer] == "cluster")
    assert summary.deadline_enforced_by == BY[trainer]
    (said,) = [line for line in lines if line.startswith("deadline: ")]
    by = {
        "step": "the train step (this cluster's TrainJob has no spec.activeDeadlineSeconds, "
        "which Kubeflow Trainer v2.2.0 (kubeflow/trainer#3258) added)",
        "cluster": "the cluster (the TrainJob's spec.activeDeadlineSeconds)",
    }
    assert said.startswith(
        f"deadline: 21600 s (active_deadline_seconds), enforced by {by[BY[trainer]]}"
    )


def test_on_trainer_v2_1_the_step_deletes_the_job_at_its_deadline_and_fails_in_one_line(
    gcs_uri: str, capsys: pytest.CaptureFixture[str]
) -> None:
    b, kind = pair("trainjob")
    with Cluster(trainer="v2.1.0") as cluster:
        op = Operator(cluster, kind)

        def script(op: Operator) -> None:
            op.start(op.wait_for_job())  # and it never ends
            op.collect(NAME)

        op.play(script)
        with pytest.raises(SystemExit) as exit_info, one_line_failures():
            run(cluster, b, make_params(gcs_uri, active_deadline_seconds=1), print)
        op.join()
        assert cluster.job_names(TRAINJOB) == [] and cluster.pod_names() == ["unrelated"]
    assert exit_info.value.code == ExitCode.RUN_FAILED
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"FAILED: {WHAT} failed: DeadlineExceeded: still Running when its 1 s deadline "
        "(active_deadline_seconds) passed, which the train step enforces (this cluster's "
        "TrainJob has no spec.activeDeadlineSeconds, which Kubeflow Trainer v2.2.0 "
        "(kubeflow/trainer#3258) added); the job was deleted"
    )
