"""The one run of a cluster job (`components.train.launcher.cluster.run.run_job`), on both backends,
with
the real ``kubernetes`` client against kmock's API emulator and the suite's fake-gcs-server.

What kmock cannot emulate (mpi-operator; Kubeflow Trainer with JobSet; pod logs, garbage
collection, label selectors) is played through the API by `standins.kmock_cluster.Operator`
with the backend's `Kind`. A difference between the backends is written where it is: in the
parameters of a test, or in a test of one backend.
"""

from __future__ import annotations

import copy
import os
import signal
import time
from unittest import mock

import pytest

from components.common import defaults, storage
from components.common.crd import Crd
from components.common.failure import SIGNAL_BASE
from components.train.launcher.cluster import job as jobs
from components.train.launcher.cluster.job import (
    ClusterJobCancelled,
    ClusterJobError,
    ClusterJobFailed,
)
from components.train.launcher.cluster.mpijob import MPIJOB
from components.train.launcher.cluster.run import check_run
from components.train.launcher.cluster.trainjob import TRAINING_RUNTIME, TRAINJOB
from components.train.tests.cluster_jobs import (
    BOTH,
    NAME,
    complete,
    make_params,
    pair,
    posts,
    run,
    store,
)
from standins.kmock_api import schema_of
from standins.kmock_cluster import NS, Cluster, Operator, pod
from standins.kmock_jobs import write_rank0_outputs
from standins.waiting import HANG_S, wait_until

pytestmark = pytest.mark.timeout(120)
# What each backend's job says while it runs: an MPIJob its condition, a TrainJob (Trainer sets
# no condition while it runs) its child jobs' counts.
RUNNING = {
    "mpijob": "Running (MPIJobRunning: launcher is running)",
    "trainjob": "Running (launcher: 1 ready of 1 active, node: 1 ready of 1 active)",
}


def wait_for(lines: list[str], text: str) -> None:
    """Until the run has logged a line with `text`, however long it takes (short of a hang)."""
    wait_until(lambda: any(text in line for line in lines), f"{text!r} in the run's log")


@BOTH
def test_create_follow_and_succeed(cluster: Cluster, gcs_uri: str, name: str) -> None:
    b, kind = pair(name)
    p, lines = make_params(gcs_uri), []
    what = b.what(NS, NAME)

    def script(op: Operator) -> None:
        pod_name = op.start(op.wait_for_job())
        op.say(pod_name, "[1,0]<stdout>:[rank 0/4] epoch 1/4 loss 0.9")
        wait_for(lines, f"{what}: {RUNNING[name]}")  # the run saw it run before it ends
        op.say(pod_name, "[1,0]<stdout>:[rank 0/4] epoch 2/4 loss 0.5")
        complete(op, NAME, pod_name, "[1,0]<stdout>:[rank 0/4] done")

    op = Operator(cluster, kind)
    op.play(script)
    summary = run(cluster, b, p, lines.append)
    op.join()

    assert summary.world_size == 4 and summary.model_uri == p.train.model_uri
    assert [line for line in lines if line.startswith("created ")][-1] == f"created {what}"
    assert posts(cluster, b.crd) == 1  # one job, the manifest the builder makes
    stored = cluster.job(NAME, b.crd)
    assert stored is not None and stored["spec"] == b.build(p, NS)[-1]["spec"]
    # the launcher's log arrived in order, each line once, and the phases were reported
    assert [line for line in lines if line.startswith("[1,0]")] == [
        "[1,0]<stdout>:[rank 0/4] epoch 1/4 loss 0.9",
        "[1,0]<stdout>:[rank 0/4] epoch 2/4 loss 0.5",
        "[1,0]<stdout>:[rank 0/4] done",
    ]
    # streamed: one request, followed as the launcher wrote, never read again
    (log,) = cluster.requests("GET", "/log")
    assert log.params["follow"].lower() == "true"
    phases = [line.split(": ", 1)[1] for line in lines if line.startswith(f"{what}: ")]
    assert RUNNING[name] in phases and phases[-1].startswith("Succeeded")
    assert phases.index(RUNNING[name]) < len(phases) - 1
    assert lines[-1].startswith(f"run summary at {p.train.summary_uri}: world_size 4")
    assert summary.deadline_enforced_by == "cluster"
    assert not cluster.requests("DELETE", f"/{b.crd.plural}")  # the TTL cleans it up


EXITED, JOBSET = "launcher exited with code 3", "jobset failed due to one or more job failures"


@pytest.mark.parametrize(
    ("name", "reason", "message", "pod_reason", "expect"),
    [
        ("mpijob", "BackoffLimitExceeded", EXITED, None, "BackoffLimitExceeded"),
        ("mpijob", "MPIJobEvicted", EXITED, "Evicted", "MPIJobEvicted"),
        ("mpijob", "JobFailed", EXITED, "Evicted", "JobFailed (launcher pod Evicted)"),
        ("mpijob", "DeadlineExceeded", EXITED, None, "DeadlineExceeded"),
        ("trainjob", "FailedJobs", JOBSET, None, "FailedJobs"),
        (
            "trainjob",
            "DeadlineExceeded",
            "TrainJob exceeded its activeDeadlineSeconds",
            None,
            "DeadlineExceeded",
        ),
        ("trainjob", "FailedJobs", JOBSET, "Evicted", "FailedJobs (launcher pod Evicted)"),
    ],
)
def test_failure_carries_reason_and_log_tail(
    cluster: Cluster,
    gcs_uri: str,
    name: str,
    reason: str,
    message: str,
    pod_reason: str | None,
    expect: str,
) -> None:
    b, kind = pair(name)

    def script(op: Operator) -> None:
        job = op.wait_for_job()
        pod_name = op.launcher(job)
        op.say(pod_name, *[f"line {i}" for i in range(80)])
        time.sleep(0.2)
        op.say(pod_name, "[1,1]<stderr>:[rank 1/4] trainer: world size 3 != workers x slots 4")
        op.end(job, 3, reason=pod_reason)
        op.conditions(job, ("Failed", reason, message))

    op = Operator(cluster, kind)
    op.play(script)
    with pytest.raises(ClusterJobFailed) as info:
        run(cluster, b, make_params(gcs_uri), lambda _: None)
    op.join()

    err = info.value
    assert (err.reason, err.message) == (expect, message)
    assert len(err.log_tail) == 50 and err.log_tail[0] == "line 31"
    assert err.log_tail[-1].endswith("world size 3 != workers x slots 4")
    assert "line 30" not in str(err)
    assert f"{b.what(NS, NAME)} failed: {expect}: {message}" in str(err)
    assert not cluster.requests("DELETE", f"/{b.crd.plural}")  # left for inspection


@BOTH
def test_the_step_deletes_a_job_the_cluster_lets_run_past_its_deadline(
    cluster: Cluster, gcs_uri: str, name: str
) -> None:
    """A backstop: the job's own deadline is the cluster's to enforce (its CRD has the
    field); one still running `deadline_grace_s` after it is deleted by the step. The run (a
    retry) finds its job running already, so the deadline cannot pass before the operator gets
    to start it, however busy the machine."""
    b, kind = pair(name)
    p = make_params(gcs_uri, active_deadline_seconds=1)
    store(cluster, b, b.build(p, NS))
    op = Operator(cluster, kind)
    op.start(NAME)
    op.play(lambda op: op.collect(NAME))
    with pytest.raises(ClusterJobFailed, match="DeadlineExceeded") as info:
        run(cluster, b, p, lambda _: None, deadline_grace_s=0.5)
    op.join()
    assert str(info.value).splitlines()[0] == (
        f"{b.what(NS, NAME)} failed: DeadlineExceeded: still Running 0.5 s after its 1 s "
        "deadline (active_deadline_seconds), which the cluster did not enforce; the job was "
        "deleted"
    )
    assert cluster.job_names(b.crd) == [] and cluster.pod_names() == ["unrelated"]


@pytest.mark.parametrize("collected", [True, False], ids=["collected", "pods-left"])
@BOTH
def test_sigterm_deletes_the_job_and_waits_for_its_pods(
    cluster: Cluster, gcs_uri: str, name: str, collected: bool
) -> None:
    b, kind = pair(name)
    lines: list[str] = []
    before = signal.getsignal(signal.SIGTERM)

    def script(op: Operator) -> None:
        op.say(op.start(op.wait_for_job()), "[1,0]<stdout>:[rank 0/4] epoch 1/4 loss 0.9")
        wait_for(lines, "epoch 1/4")
        os.kill(os.getpid(), signal.SIGTERM)  # KFP cancels the task
        if collected:  # the garbage collector deletes the pods once the job is gone, late
            wait_until(lambda: cluster.job(NAME, b.crd) is None, f"deletion of {NAME}")
            time.sleep(0.3)  # the code must wait for the pods, not just for the job
            op.collect(NAME)

    op = Operator(cluster, kind)
    op.play(script)
    what = b.what(NS, NAME)
    expect = rf"^cancelled; {what} deleted$" if collected else r"pods still present: .*-launcher-"
    with pytest.raises(ClusterJobCancelled, match=expect) as cancelled:
        run(
            cluster,
            b,
            make_params(gcs_uri),
            lines.append,
            cleanup_timeout_s=HANG_S if collected else 0.5,
        )
    op.join()
    assert cancelled.value.exit_code == SIGNAL_BASE + signal.SIGTERM  # 143, as documented
    if collected:
        assert cluster.pod_names() == ["unrelated"]  # no orphans, nothing else touched
    else:
        assert any(line.startswith("WARNING: pods ") for line in lines)
    (delete,) = cluster.requests("DELETE", f"/{b.crd.plural}/")
    assert delete.data["propagationPolicy"] == "Foreground"
    assert cluster.job_names(b.crd) == []
    assert signal.getsignal(signal.SIGTERM) == before  # the handler is restored


@BOTH
def test_retry_reattaches_to_the_same_run_job(cluster: Cluster, gcs_uri: str, name: str) -> None:
    b, kind = pair(name)
    p, lines = make_params(gcs_uri), []
    store(cluster, b, b.build(p, NS))  # the first attempt's; its pod died, the job runs on
    op = Operator(cluster, kind)
    pod_name = op.start(NAME)
    op.say(pod_name, "[1,0]<stdout>:[rank 0/4] epoch 1/4 loss 0.9")

    def script(op: Operator) -> None:
        wait_for(lines, "epoch 1/4")
        complete(op, NAME, pod_name, "[1,0]<stdout>:[rank 0/4] epoch 2/4 loss 0.5")

    op.play(script)
    assert run(cluster, b, p, lines.append).world_size == 4
    op.join()
    assert f"reattached to {b.what(NS, NAME)} (Running) from an earlier attempt" in lines
    assert cluster.job_names(b.crd) == [NAME] and posts(cluster, b.crd) == 2  # 201, 409
    assert not cluster.requests("DELETE", f"/{b.crd.plural}")
    # the log from before the reattach is shown too (the whole log is read on reattach)
    assert [line for line in lines if "epoch" in line] == [
        "[1,0]<stdout>:[rank 0/4] epoch 1/4 loss 0.9",
        "[1,0]<stdout>:[rank 0/4] epoch 2/4 loss 0.5",
    ]


@BOTH
def test_retry_replaces_a_job_that_already_failed(
    cluster: Cluster, gcs_uri: str, name: str
) -> None:
    b, kind = pair(name)
    p, lines = make_params(gcs_uri), []
    store(cluster, b, b.build(p, NS))
    Operator(cluster, kind).finish(NAME, 1)
    what = b.what(NS, NAME)

    def script(op: Operator) -> None:
        wait_for(lines, f"created {what}")
        complete(op, NAME, op.start(NAME))

    op = Operator(cluster, kind)
    op.play(script)
    run(cluster, b, p, lines.append)
    op.join()
    assert f"{what} from an earlier attempt failed ({kind.failed(1)[1]}); replacing it" in lines
    assert len(cluster.requests("DELETE", f"/{b.crd.plural}/")) == 1
    assert posts(cluster, b.crd) == 3  # setup, 409, the new one
    assert cluster.job_names(b.crd) == [NAME]


@BOTH
def test_a_same_named_job_of_another_run_is_not_adopted(
    cluster: Cluster, gcs_uri: str, name: str
) -> None:
    b, _ = pair(name)
    manifests = b.build(make_params(gcs_uri), NS)
    manifests[-1]["metadata"]["annotations"]["kfp-horovod/pipeline-run-id"] = "someone-else"
    store(cluster, b, manifests)
    with pytest.raises(ClusterJobError, match="belongs to another run"):
        run(cluster, b, make_params(gcs_uri), lambda _: None)
    assert not cluster.requests("DELETE", f"/{b.crd.plural}")


@BOTH
def test_the_task_pods_owns_the_job_built_once_and_checked_by_the_server(
    cluster: Cluster, gcs_uri: str, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The manifests are built once; the API server checks them (Strict field validation on
    every create), not an offline copy of the CRD."""
    b, kind = pair(name)
    check, build = mock.Mock(wraps=jobs.check_manifests), mock.Mock(wraps=b.build)
    monkeypatch.setattr(jobs, "check_manifests", check)
    cluster.core.create_namespaced_pod(NS, pod("train-task-pod", {}, uid="uid-42"))
    p = make_params(gcs_uri, owner_pod_name="train-task-pod")
    op = Operator(cluster, kind)
    op.play(lambda op: complete(op, NAME, op.start(op.wait_for_job())))
    run(cluster, jobs.ClusterJobKind(**{**b.__dict__, "build": build}), p, lambda _: None)
    op.join()
    assert (build.call_count, check.call_count) == (1, 0)
    creates = [r for crd in (b.crd, *b.shared) for r in cluster.requests("POST", f"/{crd.plural}")]
    assert creates and {r.params.get("fieldValidation") for r in creates} == {"Strict"}
    stored = cluster.job(NAME, b.crd)
    assert stored is not None
    (ref,) = stored["metadata"]["ownerReferences"]
    assert (ref["kind"], ref["name"], ref["uid"]) == ("Pod", "train-task-pod", "uid-42")


@pytest.mark.parametrize(
    ("name", "crd", "path"),
    [
        ("mpijob", MPIJOB, ("spec", "launcherCreationPolicy")),
        ("trainjob", TRAINING_RUNTIME, ("spec", "mlPolicy", "mpi", "runLauncherAsNode")),
    ],
)
def test_a_field_the_clusters_crd_lacks_is_refused_by_the_server_and_nothing_is_created(
    gcs_uri: str, name: str, crd: Crd, path: tuple[str, ...]
) -> None:
    """An older operator's CRD without a field the manifests set: the real client's create,
    with Strict field validation, is refused by the server, naming the field, in one line."""
    b, _ = pair(name)
    older = copy.deepcopy(dict(schema_of(crd)))
    node = older
    for key in path[:-1]:
        node = node["properties"][key]
    del node["properties"][path[-1]]
    with Cluster(schemas={crd: older}) as cluster:
        with pytest.raises(ClusterJobError) as info:
            run(cluster, b, make_params(gcs_uri), lambda _: None)
        assert all(cluster.job_names(c) == [] for c in (b.crd, *b.shared))
    said = str(info.value)
    assert said.startswith(f"the cluster refused {crd.kind} {NS}/") and "\n" not in said
    assert f'strict decoding error: unknown field "{".".join(path)}"' in said
    assert said.endswith(b.install)


def test_what_the_backend_cannot_do_is_refused_before_any_request(
    cluster: Cluster, gcs_uri: str
) -> None:
    sent_before = len(list(cluster.emu))
    with pytest.raises(ValueError, match="min_workers=1: elastic training needs"):
        run(cluster, pair("trainjob")[0], make_params(gcs_uri, min_workers=1), lambda _: None)
    assert len(list(cluster.emu)) == sent_before  # nothing was sent


@pytest.mark.parametrize(
    ("name", "served", "missing", "install"),
    [
        (
            "mpijob",
            (TRAINJOB, TRAINING_RUNTIME),
            MPIJOB,
            f"install mpi-operator {defaults.MPI_OPERATOR_VERSION}",
        ),
        *(
            ("trainjob", served, missing, f"install Kubeflow Trainer {defaults.TRAINER_VERSION}")
            for served, missing in (
                ((MPIJOB,), TRAINJOB),
                ((MPIJOB, TRAINJOB), TRAINING_RUNTIME),
                ((MPIJOB, TRAINING_RUNTIME), TRAINJOB),
            )
        ),
    ],
)
def test_a_cluster_without_the_backends_api_names_what_to_install(
    gcs_uri: str, name: str, served: tuple[Crd, ...], missing: Crd, install: str
) -> None:
    with Cluster(kinds=served) as cluster, pytest.raises(ClusterJobError) as info:
        run(cluster, pair(name)[0], make_params(gcs_uri), lambda _: None)
    assert f"does not serve {missing.kind} " in str(info.value) and install in str(info.value)
    assert not cluster.requests("POST", "/apis/")  # nothing was created


@pytest.mark.parametrize(
    ("world_size", "drop", "message"),
    [
        (3, None, "world_size=3, expected workers x slots = 2 x 2 = 4"),
        (
            None,
            "summary",
            r"the MPIJob succeeded but its run summary gs://\S+/run_summary\.json: "
            "missing",
        ),
        (None, "model", "no model at gs://"),
    ],
)
def test_success_checks(
    gcs_uri: str, world_size: int | None, drop: str | None, message: str
) -> None:
    p = make_params(gcs_uri)
    if drop != "summary":
        write_rank0_outputs(p.train, world_size)
    if drop == "model":
        storage.remove_tree(p.train.model_uri)
    with pytest.raises(ClusterJobError, match=message):
        check_run(p, "MPIJob", log=lambda _: None)
    good = make_params(gcs_uri, model_dir=f"{gcs_uri}/models/m")
    write_rank0_outputs(good.train)
    assert check_run(good, "MPIJob", log=lambda _: None).config.world_size == 4
