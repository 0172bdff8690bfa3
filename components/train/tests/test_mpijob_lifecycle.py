"""The MPIJob lifecycle with the real ``kubernetes`` client against kmock's API emulator.

Real parts: the kubernetes 30.1.0 client over HTTP, kmock's ``KubernetesEmulator`` (stores,
lists, patches and deletes objects), and the suite's in-memory ``fake-gcs-server`` for the
run's outputs.

What kmock cannot emulate (mpi-operator, pod logs, garbage collection, label selectors), the
test plays itself through `standins.kmock_cluster` (`Cluster`, `Operator`), which says how; the
fault benchmark (bench/faults/) drives the same code paths with the same pieces.
"""

from __future__ import annotations

import copy
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from components.common import storage
from components.train.cluster.crd import ManifestError, find_crd
from components.train.cluster.lifecycle import JobCancelled, JobError, JobFailed, RunCheckError
from components.train.cluster.params import ClusterJobParams, job_name
from components.train.cluster.run import check_run
from components.train.mpijob.lifecycle import run_mpijob
from components.train.mpijob.manifest import build_manifest
from components.train.mpijob.validate import MPIJOB
from components.train.tests.cluster_jobs import POLL, make_params, write_outputs
from standins.kmock_cluster import NS, Cluster, G, Operator, P, V, pod

pytestmark = pytest.mark.timeout(120)


def progress(name: str, op: Operator, p: ClusterJobParams) -> str:
    """Created -> launcher starts -> Running with some output; returns the launcher pod."""
    op.conditions(name, ("Created", "MPIJobCreated", "MPIJob created"))
    time.sleep(0.1)
    pod_name = op.launcher(name)
    op.conditions(
        name,
        ("Created", "MPIJobCreated", "MPIJob created"),
        ("Running", "MPIJobRunning", "launcher is running"),
    )
    op.say(pod_name, f"[1,0]<stdout>:[rank 0/{p.train.world_size}] epoch 1/4 loss 0.9")
    time.sleep(0.2)
    op.say(pod_name, f"[1,0]<stdout>:[rank 0/{p.train.world_size}] epoch 2/4 loss 0.5")
    time.sleep(0.2)
    return pod_name


# --- tests -------------------------------------------------------------------------------------


def test_create_follow_and_succeed(cluster: Cluster, bucket: str) -> None:
    p = make_params(bucket)
    op = Operator(cluster)
    lines: list[str] = []

    def script(op: Operator) -> None:
        name = op.wait_for_job()
        pod_name = progress(name, op, p)
        op.say(pod_name, "[1,0]<stdout>:[rank 0/4] done")
        write_outputs(p)
        op.conditions(
            name,
            ("Created", "MPIJobCreated", ""),
            ("Running", "MPIJobRunning", ""),
            ("Succeeded", "MPIJobSucceeded", "MPIJob kubeflow-user/x successfully completed."),
        )

    op.play(script)
    summary = run_mpijob(
        p, namespace=NS, api_client=cluster.api, poll_interval_s=POLL, log=lines.append
    )
    op.join()

    assert summary.world_size == 4 and summary.model_uri == p.train.model_uri
    name = job_name("nightly", "run-123")
    assert lines[0] == f"created MPIJob {NS}/{name}"
    # exactly one job was created, and it is the manifest the builder makes
    assert len(cluster.requests("POST", "/mpijobs")) == 1
    stored = cluster.job(name)
    assert stored is not None and stored["spec"] == build_manifest(p, NS)["spec"]
    # the launcher's log arrived in order, each line once, and the phases were reported
    log_lines = [line for line in lines if line.startswith("[1,0]")]
    assert log_lines == [
        "[1,0]<stdout>:[rank 0/4] epoch 1/4 loss 0.9",
        "[1,0]<stdout>:[rank 0/4] epoch 2/4 loss 0.5",
        "[1,0]<stdout>:[rank 0/4] done",
    ]
    phases = [line.split(": ", 1)[1].split(" ")[0] for line in lines if line.startswith("MPIJob ")]
    assert phases[-2:] == ["Running", "Succeeded"]
    assert phases.index("Running") < phases.index("Succeeded")
    # a successful run is not deleted (the TTL cleans it up)
    assert not cluster.requests("DELETE", "/mpijobs")


@pytest.mark.parametrize(
    ("reason", "pod_reason", "expect"),
    [
        ("BackoffLimitExceeded", None, "BackoffLimitExceeded"),
        ("MPIJobEvicted", "Evicted", "MPIJobEvicted"),
        ("JobFailed", "Evicted", "JobFailed (launcher pod Evicted)"),
        ("DeadlineExceeded", None, "DeadlineExceeded"),
    ],
)
def test_failure_carries_reason_and_log_tail(
    cluster: Cluster, bucket: str, reason: str, pod_reason: str | None, expect: str
) -> None:
    p = make_params(bucket)
    op = Operator(cluster)
    lines: list[str] = []

    def script(op: Operator) -> None:
        name = op.wait_for_job()
        op.conditions(name, ("Created", "MPIJobCreated", ""))
        pod_name = op.launcher(name, reason=pod_reason)
        op.conditions(name, ("Running", "MPIJobRunning", ""))
        op.say(pod_name, *[f"line {i}" for i in range(80)])
        time.sleep(0.2)
        op.say(pod_name, "[1,1]<stderr>:[rank 1/4] trainer: world size 3 != workers x slots 4")
        time.sleep(0.2)
        op.conditions(name, ("Failed", reason, "launcher exited with code 3"))

    op.play(script)
    with pytest.raises(JobFailed) as info:
        run_mpijob(p, namespace=NS, api_client=cluster.api, poll_interval_s=POLL, log=lines.append)
    op.join()

    err = info.value
    assert err.reason == expect
    assert err.message == "launcher exited with code 3"
    assert len(err.log_tail) == 50
    assert err.log_tail[-1].endswith("world size 3 != workers x slots 4")
    assert err.log_tail[0] == "line 31"
    assert "line 30" not in str(err) and "world size 3 != workers x slots 4" in str(err)
    assert f"failed: {expect}: launcher exited with code 3" in str(err)
    # a failed job is left for inspection (TTL removes it); no outputs are checked
    assert not cluster.requests("DELETE", "/mpijobs")


def test_client_side_deadline_deletes_a_stuck_job(cluster: Cluster, bucket: str) -> None:
    p = make_params(bucket, active_deadline_seconds=1)
    op = Operator(cluster)

    def script(op: Operator) -> None:
        name = op.wait_for_job()
        op.conditions(name, ("Created", "MPIJobCreated", ""))  # and never runs

    op.play(script)
    with pytest.raises(JobFailed, match="DeadlineExceeded") as info:
        run_mpijob(
            p,
            namespace=NS,
            api_client=cluster.api,
            poll_interval_s=POLL,
            log=lambda _: None,
            deadline_grace_s=0.5,
        )
    op.join()
    assert "still Created after 2s" in str(info.value)
    assert cluster.job_names() == []


def test_sigterm_deletes_the_job_and_waits_for_its_pods(cluster: Cluster, bucket: str) -> None:
    p = make_params(bucket)
    op = Operator(cluster)
    lines: list[str] = []
    before = signal.getsignal(signal.SIGTERM)

    def script(op: Operator) -> None:
        name = op.wait_for_job()
        progress(name, op, p)
        end = time.monotonic() + 10
        while not any("epoch 2/4" in line for line in lines) and time.monotonic() < end:
            time.sleep(0.02)
        os.kill(os.getpid(), signal.SIGTERM)  # KFP cancels the task
        # the garbage collector's part: once the job is gone, its pods go
        while cluster.job(name) is not None and time.monotonic() < end:
            time.sleep(0.02)
        time.sleep(0.3)  # the code must wait for the pods, not just for the job
        for pod_name in cluster.pod_names():
            if pod_name.startswith(name):
                cluster.core.delete_namespaced_pod(pod_name, NS)

    op.play(script)
    name = job_name("nightly", "run-123")
    with pytest.raises(JobCancelled, match=rf"^cancelled; MPIJob {NS}/{name} deleted$"):
        run_mpijob(
            p,
            namespace=NS,
            api_client=cluster.api,
            poll_interval_s=POLL,
            log=lines.append,
            cleanup_timeout_s=10,
        )
    assert cluster.pod_names() == ["unrelated"]  # no orphans when it ends, nothing else touched
    op.join()

    (delete,) = cluster.requests("DELETE", "/mpijobs/")
    assert delete.data["propagationPolicy"] == "Foreground"
    assert cluster.job_names() == []
    assert signal.getsignal(signal.SIGTERM) == before  # the handler is restored


def test_sigterm_reports_pods_left_behind(cluster: Cluster, bucket: str) -> None:
    p = make_params(bucket)
    op = Operator(cluster)
    lines: list[str] = []

    def script(op: Operator) -> None:
        name = op.wait_for_job()
        progress(name, op, p)
        os.kill(os.getpid(), signal.SIGTERM)  # and no garbage collector runs

    op.play(script)
    with pytest.raises(JobCancelled, match=r"pods still present: .*-launcher-[b-z2-9]{5}\b"):
        run_mpijob(
            p,
            namespace=NS,
            api_client=cluster.api,
            poll_interval_s=POLL,
            log=lines.append,
            cleanup_timeout_s=0.5,
        )
    op.join()
    assert any(line.startswith("WARNING: pods ") for line in lines)


def test_retry_reattaches_to_the_same_run_job(cluster: Cluster, bucket: str) -> None:
    p = make_params(bucket)
    op = Operator(cluster)
    name = job_name("nightly", "run-123")
    # the first attempt created the job and its pod died; the job runs on
    cluster.custom.create_namespaced_custom_object(G, V, NS, P, build_manifest(p, NS))
    op.conditions(name, ("Created", "", ""), ("Running", "MPIJobRunning", ""))
    pod_name = op.launcher(name)
    op.say(pod_name, "[1,0]<stdout>:[rank 0/4] epoch 1/4 loss 0.9")
    lines: list[str] = []

    def script(op: Operator) -> None:
        end = time.monotonic() + 10
        while not any("epoch 1/4" in line for line in lines) and time.monotonic() < end:
            time.sleep(0.02)
        op.say(pod_name, "[1,0]<stdout>:[rank 0/4] epoch 2/4 loss 0.5")
        time.sleep(0.2)
        write_outputs(p)
        op.conditions(name, ("Succeeded", "MPIJobSucceeded", ""))

    op.play(script)
    summary = run_mpijob(
        p, namespace=NS, api_client=cluster.api, poll_interval_s=POLL, log=lines.append
    )
    op.join()

    assert summary.world_size == 4
    assert lines[0] == f"reattached to MPIJob {NS}/{name} (Running) from an earlier attempt"
    assert cluster.job_names() == [name]
    assert not cluster.requests("DELETE", "/mpijobs")
    # the log from before the reattach is shown too (the whole log is read on reattach)
    assert [line for line in lines if "epoch" in line] == [
        "[1,0]<stdout>:[rank 0/4] epoch 1/4 loss 0.9",
        "[1,0]<stdout>:[rank 0/4] epoch 2/4 loss 0.5",
    ]


def test_retry_replaces_a_job_that_already_failed(cluster: Cluster, bucket: str) -> None:
    p = make_params(bucket)
    op = Operator(cluster)
    name = job_name("nightly", "run-123")
    cluster.custom.create_namespaced_custom_object(G, V, NS, P, build_manifest(p, NS))
    op.conditions(name, ("Failed", "BackoffLimitExceeded", "boom"))
    lines: list[str] = []

    def script(op: Operator) -> None:
        end = time.monotonic() + 10
        while not any(line.startswith("created MPIJob") for line in lines):
            assert time.monotonic() < end
            time.sleep(0.02)
        write_outputs(p)
        op.conditions(name, ("Succeeded", "MPIJobSucceeded", ""))

    op.play(script)
    run_mpijob(p, namespace=NS, api_client=cluster.api, poll_interval_s=POLL, log=lines.append)
    op.join()
    assert "failed (BackoffLimitExceeded); replacing it" in lines[0]
    assert len(cluster.requests("DELETE", "/mpijobs/")) == 1
    assert len(cluster.requests("POST", "/mpijobs")) == 3  # setup, 409, the new one
    assert cluster.job_names() == [name]


def test_a_same_named_job_of_another_run_is_not_adopted(cluster: Cluster, bucket: str) -> None:
    p = make_params(bucket)
    other = build_manifest(p, NS)
    other["metadata"]["annotations"]["kfp-horovod/pipeline-run-id"] = "someone-else"
    cluster.custom.create_namespaced_custom_object(G, V, NS, P, other)
    with pytest.raises(JobError, match="belongs to another run"):
        run_mpijob(
            p, namespace=NS, api_client=cluster.api, poll_interval_s=POLL, log=lambda _: None
        )
    assert not cluster.requests("DELETE", "/mpijobs")


def run_owned_job_to_success(cluster: Cluster, bucket: str, uid: str) -> dict[str, Any]:
    """Run a job owned by the task pod (uid `uid`) to success; return the created MPIJob."""
    cluster.core.create_namespaced_pod(NS, pod("train-task-pod", {}, uid=uid))
    p = make_params(bucket, owner_pod_name="train-task-pod")
    op = Operator(cluster)

    def script(op: Operator) -> None:
        name = op.wait_for_job()
        write_outputs(p)
        op.conditions(name, ("Succeeded", "MPIJobSucceeded", ""))

    op.play(script)
    run_mpijob(p, namespace=NS, api_client=cluster.api, poll_interval_s=POLL, log=lambda _: None)
    op.join()
    job = cluster.job(job_name("nightly", "run-123"))
    assert job is not None
    return job


def test_owner_reference_to_the_task_pod(cluster: Cluster, bucket: str) -> None:
    job = run_owned_job_to_success(cluster, bucket, uid="uid-42")
    (ref,) = job["metadata"]["ownerReferences"]
    assert (ref["kind"], ref["name"], ref["uid"]) == ("Pod", "train-task-pod", "uid-42")


def test_schema_invalid_spec_is_refused_before_any_request(
    cluster: Cluster, bucket: str, tmp_path: Path
) -> None:
    # an older mpi-operator CRD without launcherCreationPolicy: our manifest does not fit it
    crd = yaml.safe_load(find_crd(MPIJOB).read_text())
    old = copy.deepcopy(crd)
    spec_props = old["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    del spec_props["properties"]["launcherCreationPolicy"]
    path = tmp_path / "old-crd.yaml"
    path.write_text(yaml.safe_dump(old))
    sent_before = len(list(cluster.emu))

    with pytest.raises(ManifestError, match=r"spec: .*'launcherCreationPolicy' was unexpected"):
        run_mpijob(
            make_params(bucket),
            namespace=NS,
            api_client=cluster.api,
            crd_path=str(path),
            log=lambda _: None,
        )
    assert len(list(cluster.emu)) == sent_before  # nothing was sent


@pytest.mark.parametrize(
    ("world_size", "drop", "message"),
    [
        (3, None, "world_size=3, expected workers x slots = 2 x 2 = 4"),
        (
            None,
            "summary",
            r"the MPIJob succeeded but its run summary gs://\S+/run_summary\.json: missing",
        ),
        (None, "model", "no model at gs://"),
    ],
)
def test_success_checks(
    bucket: str, world_size: int | None, drop: str | None, message: str
) -> None:
    p = make_params(bucket)
    if drop != "summary":
        write_outputs(p, world_size)
    if drop == "model":
        storage.remove_tree(p.train.model_uri)
    with pytest.raises(RunCheckError, match=message):
        check_run(p, "MPIJob", log=lambda _: None)


def test_success_check_passes_on_good_outputs(bucket: str) -> None:
    p = make_params(bucket, model_dir=f"{bucket}/models/m")
    write_outputs(p)
    assert check_run(p, "MPIJob", log=lambda _: None).config.world_size == 4


def test_manifest_is_built_and_validated_once(
    cluster: Cluster, bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The real builder and validator, counted: one manifest per run, checked once."""
    from components.train.mpijob import lifecycle

    calls = {"build": 0, "validate": 0}

    def counted(name: str, real: Any) -> Any:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            calls[name] += 1
            return real(*args, **kwargs)

        return wrapper

    monkeypatch.setattr(lifecycle, "build_manifest", counted("build", lifecycle.build_manifest))
    monkeypatch.setattr(
        lifecycle, "validate_manifest", counted("validate", lifecycle.validate_manifest)
    )
    job = run_owned_job_to_success(cluster, bucket, uid="uid-7")
    assert calls == {"build": 1, "validate": 1}
    assert job["metadata"]["ownerReferences"][0]["uid"] == "uid-7"
