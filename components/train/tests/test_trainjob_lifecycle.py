"""The TrainJob lifecycle with the real ``kubernetes`` client against kmock's API emulator.

The same real parts as the MPIJob lifecycle's tests (test_mpijob_lifecycle.py): the kubernetes
client over HTTP, kmock's ``KubernetesEmulator`` and the suite's in-memory fake-gcs-server.
Kubeflow Trainer, JobSet, the kubelet and the garbage collector are played through the API by
`standins.kmock_cluster.Operator` with the TrainJob kind (`standins.kmock_jobs`), which says
how; one test runs the real trainer from the stored TrainJob's command (`TrainerOperator`).
"""

from __future__ import annotations

import copy
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from components.common import defaults
from components.train.cluster.crd import Crd, ManifestError, find_crd
from components.train.cluster.lifecycle import JobCancelled, JobError, JobFailed, RunCheckError
from components.train.cluster.params import ClusterJobParams, job_name
from components.train.mpijob.validate import MPIJOB
from components.train.summary import RunSummary
from components.train.tests.cluster_jobs import POLL, make_params
from components.train.trainjob.lifecycle import run_trainjob
from components.train.trainjob.manifest import (
    RUNTIME_SPEC_ANNOTATION,
    TRAINING_RUNTIME,
    TRAINJOB,
    build_manifests,
)
from standins.kmock_cluster import NS, TRAINJOB_KIND, Cluster, Operator

pytestmark = pytest.mark.timeout(120)

NAME = job_name("nightly", "run-123")
WHAT = f"TrainJob {NS}/{NAME}"


def run(cluster: Cluster, p: ClusterJobParams, log: Callable[[str], None], **kw: Any) -> RunSummary:
    """`run_trainjob` of `p` against `cluster`, polling fast."""
    return run_trainjob(
        p, namespace=NS, api_client=cluster.api, poll_interval_s=POLL, log=log, **kw
    )


def play(cluster: Cluster, script: Callable[[Operator], None]) -> Operator:
    """Trainer and JobSet, played by `script` in a thread."""
    op = Operator(cluster, TRAINJOB_KIND)
    op.play(script)
    return op


def store(cluster: Cluster, *manifests: dict[str, Any]) -> None:
    """Store `manifests` as an earlier attempt (or someone else) left them."""
    for m in manifests:
        crd = TRAINING_RUNTIME if m["kind"] == TRAINING_RUNTIME.kind else TRAINJOB
        cluster.custom.create_namespaced_custom_object(crd.group, crd.version, NS, crd.plural, m)


def posts(cluster: Cluster, crd: Crd) -> int:
    return len(cluster.requests("POST", f"/{crd.plural}"))


def wait_for(lines: list[str], text: str, timeout: float = 10.0) -> None:
    end = time.monotonic() + timeout
    while not any(text in line for line in lines):
        assert time.monotonic() < end, f"no {text!r} in the log"
        time.sleep(0.02)


def complete(
    op: Operator, name: str, pod_name: str, *lines: str, world_size: int | None = None
) -> None:
    """The launcher prints `lines`, rank 0 writes its outputs, the TrainJob completes."""
    op.say(pod_name, *lines)
    time.sleep(0.2)
    op.write_outputs(name, world_size)
    op.finish(name, 0)


# --- the API and the runtime --------------------------------------------------------------------


@pytest.mark.parametrize("served", [(MPIJOB,), (MPIJOB, TRAINJOB), (MPIJOB, TRAINING_RUNTIME)])
def test_a_cluster_without_the_trainer_api_names_the_trainer_version(
    bucket: str, served: tuple[Crd, ...]
) -> None:
    with Cluster(kinds=served) as cluster:
        missing = TRAINJOB if TRAINJOB not in served else TRAINING_RUNTIME
        with pytest.raises(JobError, match=f"does not serve {missing.kind} ") as info:
            run(cluster, make_params(bucket), lambda _: None)
        assert f"install Kubeflow Trainer {defaults.TRAINER_VERSION}" in str(info.value)
        # nothing was created
        assert posts(cluster, TRAINJOB) == posts(cluster, TRAINING_RUNTIME) == 0


def test_the_runtime_is_created_when_absent_and_reused_when_present(
    cluster: Cluster, bucket: str
) -> None:
    p = make_params(bucket)
    runtime, _ = build_manifests(p, NS)
    lines: list[str] = []

    def script(op: Operator) -> None:
        name = op.wait_for_job()
        complete(op, name, op.start(name), "[1,0]<stdout>:done")

    op = play(cluster, script)
    run(cluster, p, lines.append)
    op.join()
    stored = cluster.job(runtime["metadata"]["name"], TRAINING_RUNTIME)
    assert stored is not None and stored["spec"] == runtime["spec"]
    assert lines[0] == f"created TrainingRuntime {NS}/{runtime['metadata']['name']}"

    # another run with the same settings shares the runtime: no second create
    other = make_params(bucket, run_name="weekly", pipeline_run_id="run-456")
    assert build_manifests(other, NS)[0] == runtime
    weekly = job_name("weekly", "run-456")
    op = play(cluster, lambda op: complete(op, weekly, op.start(op.wait_for_job(name=weekly))))
    lines.clear()
    run(cluster, other, lines.append)
    op.join()
    assert posts(cluster, TRAINING_RUNTIME) == 1
    assert lines[0] == f"using TrainingRuntime {NS}/{runtime['metadata']['name']}"
    assert sorted(cluster.job_names(TRAINJOB)) == sorted([NAME, weekly])


def test_a_runtime_of_that_name_with_another_spec_is_refused(cluster: Cluster, bucket: str) -> None:
    p = make_params(bucket)
    runtime, _ = build_manifests(p, NS)
    changed = copy.deepcopy(runtime)
    changed["metadata"]["annotations"][RUNTIME_SPEC_ANNOTATION] = "0" * 64
    changed["spec"]["mlPolicy"]["mpi"]["runLauncherAsNode"] = False  # someone edited it
    store(cluster, changed)
    with pytest.raises(JobError, match="exists but was not made from this spec"):
        run(cluster, p, lambda _: None)
    assert posts(cluster, TRAINJOB) == 0  # no TrainJob on a runtime that is not ours
    assert posts(cluster, TRAINING_RUNTIME) == 1  # the test's own


# --- create, follow, fail, deadline ---------------------------------------------------------


def test_create_follow_and_succeed(cluster: Cluster, bucket: str) -> None:
    p = make_params(bucket)
    lines: list[str] = []

    def script(op: Operator) -> None:
        name = op.wait_for_job()
        pod_name = op.start(name)
        op.say(pod_name, "[1,0]<stdout>:[rank 0/4] epoch 1/4 loss 0.9")
        time.sleep(0.2)
        op.say(pod_name, "[1,0]<stdout>:[rank 0/4] epoch 2/4 loss 0.5")
        complete(op, name, pod_name, "[1,0]<stdout>:[rank 0/4] done")

    op = play(cluster, script)
    summary = run(cluster, p, lines.append)
    op.join()

    assert summary.world_size == 4 and summary.model_uri == p.train.model_uri
    assert lines[1] == f"created {WHAT}"
    assert posts(cluster, TRAINJOB) == 1
    stored = cluster.job(NAME, TRAINJOB)
    assert stored is not None and stored["spec"] == build_manifests(p, NS)[1]["spec"]
    # the launcher's log arrived in order, each line once, and the end was reported
    assert [line for line in lines if line.startswith("[1,0]")] == [
        "[1,0]<stdout>:[rank 0/4] epoch 1/4 loss 0.9",
        "[1,0]<stdout>:[rank 0/4] epoch 2/4 loss 0.5",
        "[1,0]<stdout>:[rank 0/4] done",
    ]
    # Trainer sets no condition while the job runs: its child jobs' counts say it runs
    assert f"{WHAT}: Running (launcher: 1 ready of 1 active, node: 1 ready of 1 active)" in lines
    assert any(line.startswith(f"{WHAT}: Succeeded") for line in lines)
    assert lines[-1].startswith(f"run summary at {p.train.summary_uri}: world_size 4")
    assert not cluster.requests("DELETE", "/trainjobs")  # a finished job is left to its TTL


@pytest.mark.parametrize(
    ("reason", "message", "pod_reason", "expect"),
    [
        ("FailedJobs", "jobset failed due to one or more job failures", None, "FailedJobs"),
        ("DeadlineExceeded", "TrainJob exceeded its activeDeadlineSeconds", None,
         "DeadlineExceeded"),
        ("FailedJobs", "jobset failed due to one or more job failures", "Evicted",
         "FailedJobs (launcher pod Evicted)"),
    ],
)  # fmt: skip
def test_failure_carries_reason_and_log_tail(
    cluster: Cluster, bucket: str, reason: str, message: str, pod_reason: str | None, expect: str
) -> None:
    def script(op: Operator) -> None:
        name = op.wait_for_job()
        pod_name = op.launcher(name, reason=pod_reason)
        op.say(pod_name, *[f"line {i}" for i in range(80)])
        time.sleep(0.2)
        op.say(pod_name, "[1,1]<stderr>:[rank 1/4] trainer: world size 3 != workers x slots 4")
        time.sleep(0.2)
        op.conditions(name, ("Failed", reason, message))

    op = play(cluster, script)
    with pytest.raises(JobFailed) as info:
        run(cluster, make_params(bucket), lambda _: None)
    op.join()

    err = info.value
    assert (err.reason, err.message) == (expect, message)
    assert len(err.log_tail) == 50 and err.log_tail[0] == "line 31"
    assert err.log_tail[-1].endswith("world size 3 != workers x slots 4")
    assert f"{WHAT} failed: {expect}: {message}" in str(err)
    assert not cluster.requests("DELETE", "/trainjobs")  # left for inspection


def test_client_side_deadline_deletes_a_stuck_job(cluster: Cluster, bucket: str) -> None:
    def script(op: Operator) -> None:
        op.launcher(op.wait_for_job())  # and it never ends
        assert op.collect(NAME, timeout=10)

    op = play(cluster, script)
    with pytest.raises(JobFailed, match="DeadlineExceeded") as info:
        run(cluster, make_params(bucket, active_deadline_seconds=1), lambda _: None,
            deadline_grace_s=0.5)  # fmt: skip
    op.join()
    assert "still Running after 2s; the job was deleted" in str(info.value)
    assert cluster.job_names(TRAINJOB) == [] and cluster.pod_names() == ["unrelated"]


# --- cancel, retry, ownership ---------------------------------------------------------------


def test_sigterm_deletes_the_trainjob_and_waits_for_its_pods(cluster: Cluster, bucket: str) -> None:
    lines: list[str] = []
    before = signal.getsignal(signal.SIGTERM)

    def script(op: Operator) -> None:
        name = op.wait_for_job()
        op.say(op.start(name), "[1,0]<stdout>:[rank 0/4] epoch 1/4 loss 0.9")
        wait_for(lines, "epoch 1/4")
        os.kill(os.getpid(), signal.SIGTERM)  # KFP cancels the task
        while cluster.job(name, TRAINJOB) is not None:
            time.sleep(0.02)
        time.sleep(0.3)  # the code must wait for the pods, not just for the job
        assert op.collect(name)

    op = play(cluster, script)
    with pytest.raises(JobCancelled, match=rf"^cancelled; {WHAT} deleted$"):
        run(cluster, make_params(bucket), lines.append, cleanup_timeout_s=10)
    assert cluster.pod_names() == ["unrelated"]  # gone before the task ends, nothing else touched
    op.join()

    (delete,) = cluster.requests("DELETE", "/trainjobs/")
    assert delete.data["propagationPolicy"] == "Foreground"
    assert cluster.job_names(TRAINJOB) == []
    assert signal.getsignal(signal.SIGTERM) == before


def test_retry_reattaches_to_the_same_run_trainjob(cluster: Cluster, bucket: str) -> None:
    p = make_params(bucket)
    store(cluster, *build_manifests(p, NS))  # the first attempt's; its pod died
    op = Operator(cluster, TRAINJOB_KIND)
    pod_name = op.start(NAME)
    op.say(pod_name, "[1,0]<stdout>:[rank 0/4] epoch 1/4 loss 0.9")
    lines: list[str] = []

    def script(op: Operator) -> None:
        wait_for(lines, "epoch 1/4")
        complete(op, NAME, pod_name, "[1,0]<stdout>:[rank 0/4] epoch 2/4 loss 0.5")

    op.play(script)
    assert run(cluster, p, lines.append)["world_size"] == 4
    op.join()

    assert f"reattached to {WHAT} (Running) from an earlier attempt" in lines
    assert cluster.job_names(TRAINJOB) == [NAME] and posts(cluster, TRAINJOB) == 2  # 201, 409
    assert not cluster.requests("DELETE", "/trainjobs")
    assert [line for line in lines if "epoch" in line] == [
        "[1,0]<stdout>:[rank 0/4] epoch 1/4 loss 0.9",
        "[1,0]<stdout>:[rank 0/4] epoch 2/4 loss 0.5",
    ]


def test_retry_replaces_a_trainjob_that_already_failed(cluster: Cluster, bucket: str) -> None:
    p = make_params(bucket)
    store(cluster, *build_manifests(p, NS))
    Operator(cluster, TRAINJOB_KIND).finish(NAME, 1)
    lines: list[str] = []

    def script(op: Operator) -> None:
        wait_for(lines, f"created {WHAT}")
        complete(op, NAME, op.start(NAME))

    op = play(cluster, script)
    run(cluster, p, lines.append)
    op.join()
    assert f"{WHAT} from an earlier attempt failed (FailedJobs); replacing it" in lines
    assert len(cluster.requests("DELETE", "/trainjobs/")) == 1
    assert posts(cluster, TRAINJOB) == 3  # setup, 409, the new one
    assert cluster.job_names(TRAINJOB) == [NAME]


def test_a_same_named_trainjob_of_another_run_is_not_adopted(cluster: Cluster, bucket: str) -> None:
    p = make_params(bucket)
    runtime, other = build_manifests(p, NS)
    other["metadata"]["annotations"]["kfp-horovod/pipeline-run-id"] = "someone-else"
    store(cluster, runtime, other)
    with pytest.raises(JobError, match="belongs to another run"):
        run(cluster, p, lambda _: None)
    assert not cluster.requests("DELETE", "/trainjobs")


# --- checks: outputs and manifests ----------------------------------------------------------


def test_the_world_size_is_checked(cluster: Cluster, bucket: str) -> None:
    def script(op: Operator) -> None:
        name = op.wait_for_job()
        complete(op, name, op.start(name), world_size=3)  # one rank short

    op = play(cluster, script)
    with pytest.raises(RunCheckError, match="world_size=3, expected workers x slots = 2 x 2 = 4"):
        run(cluster, make_params(bucket), lambda _: None)
    op.join()


def test_elastic_is_refused_before_any_request(cluster: Cluster, bucket: str) -> None:
    sent_before = len(list(cluster.emu))
    with pytest.raises(ValueError, match="min_workers=1: elastic training needs mpi-operator"):
        run(cluster, make_params(bucket, min_workers=1), lambda _: None)
    assert len(list(cluster.emu)) == sent_before


def test_a_trainjob_its_crd_lacks_a_field_for_is_refused_before_any_request(
    cluster: Cluster, bucket: str, tmp_path: Path
) -> None:
    """An older Trainer's TrainJob CRD without activeDeadlineSeconds: the manifest does not fit."""
    for crd in (TRAINING_RUNTIME, TRAINJOB):
        doc = yaml.safe_load(find_crd(crd).read_text())
        if crd is TRAINJOB:
            spec = doc["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
            del spec["properties"]["activeDeadlineSeconds"]
        (tmp_path / crd.relative_path.name).write_text(yaml.safe_dump(doc))
    sent_before = len(list(cluster.emu))
    with pytest.raises(ManifestError, match=r"spec: .*'activeDeadlineSeconds' was unexpected"):
        run(cluster, make_params(bucket), lambda _: None, crd_dir=str(tmp_path))
    assert len(list(cluster.emu)) == sent_before


# --- the real trainer, from the stored TrainJob's command -----------------------------------


@pytest.mark.horovod
def test_the_stored_trainjob_trains_one_model(cluster: Cluster, bucket: str) -> None:
    """The TrainJob's own command line (2 nodes x 1 process, the small model, 1 epoch on 400
    digits) run by horovodrun here: one model, the world size the run check wants."""
    from components.data_prep.prep import prepare
    from standins.kmock_cluster import TrainerOperator

    prepare("bundled", f"{bucket}/data", shard_size=200, limit=400)
    p = make_params(
        bucket, slots_per_worker=1, epochs=1, model="small", threads_per_worker=1,
        batch_size_per_worker=32, warmup_epochs=0,
    )  # fmt: skip
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}  # STORAGE_EMULATOR_HOST included
    op = TrainerOperator(cluster, env, TRAINJOB_KIND)
    codes: list[int | None] = []
    op.play(lambda op: codes.append(op.serve(op.wait_for_job())))
    lines: list[str] = []
    summary = run(cluster, p, lines.append)
    op.join(300)

    assert codes == [0] and op.starts == 1
    assert summary.world_size == 2 and summary.weights_identical_across_ranks
    # the launcher's own lines, streamed from its pod's log
    assert any(line.startswith("[1,0]<stdout>:[rank 0/2] Epoch 1/1 - loss") for line in lines)
