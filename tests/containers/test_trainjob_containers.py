"""The training TrainJob executed the way Kubeflow Trainer v2.3 (MPI plugin) and JobSet execute
it: real trainer image, real Open MPI, real sshd and ssh, real Horovod, data and model on gs://
(the emulator), the launcher running as node 0 (``runLauncherAsNode``).

Trainer, JobSet and the kubelet are played by `trainjob_harness` (see its docstring);
everything the containers run comes from the TrainingRuntime and TrainJob that
`build_manifests` makes, the same builder as ``render-trainjob`` and the train component.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from components.common import storage
from components.train import checkpoints
from components.train.cluster.job import ClusterJobParams
from components.train.cluster.trainjob import build_manifests
from standins.outputs import half_written
from standins.pods import LauncherResult
from standins.trainjob_harness import TrainJobRun
from tests.containers.support import (
    NAMESPACE,
    STALL_SECONDS,
    assert_epochs_once_and_no_line_per_rank,
    bucket_of,
    model_files,
    params,
    wait_for_checkpoint,
)

pytestmark = pytest.mark.containers

# What the launcher and a node see of their pod, read inside them while the job runs.
RESERVED = "^OMPI_MCA_(orte_default_hostfile|orte_keep_fqdn_hostnames|orte_set_default_slots|plm_rsh_args)="  # noqa: E501
STAT = "stat -c '%n %a %U:%G' -L "
LOOK_LAUNCHER = f"cat /etc/mpi/hostfile; env | grep -E '{RESERVED}' | sort; {STAT}"
LOOK_NODE = f"ls /etc/mpi 2>&1; env | grep -cE '{RESERVED}'; {STAT}"
SSH_FILES = ("id_rsa", "id_rsa.pub", "authorized_keys")


def _look(container: Any, script: str, ssh_mount: str) -> str:
    files = " ".join(f"{ssh_mount}/{f}" for f in SSH_FILES)
    return str(container.exec_run(["bash", "-c", script + files]).output.decode())


def run_trainjob(
    p: ClusterJobParams, docker: Any, gcs: tuple[Any, str], tmp: Path
) -> dict[str, Any]:
    """Run the TrainJob of `p` to its end; returns the result, the summary, the JobSet's
    status, what the pods saw of their layout, and the harness's names."""
    runtime, trainjob = build_manifests(p, NAMESPACE)
    with TrainJobRun(runtime, trainjob, docker, tmp, emulator=gcs[0]) as job:
        job.start_nodes()
        job.wait_ready()
        job.start_launcher()
        seen = {
            "launcher": _look(job.launcher, LOOK_LAUNCHER, job.ssh_mount),
            "node": _look(job.nodes[0], LOOK_NODE, job.ssh_mount),
            "labels": [c.labels for c in job.containers()],
        }
        result = job.wait_launcher(timeout=600)
        status = job.jobset_status()
    summary_text = (
        storage.read_text(p.train.summary_uri) if storage.exists(p.train.summary_uri) else "{}"
    )
    summary = json.loads(summary_text)
    ranks = {r["rank"]: r["host"] for r in summary.get("per_rank", [])}
    print(f"{p.run_name}: launcher exit {result.exit_code} after {result.seconds:.1f} s; {ranks}")
    return {"result": result, "summary": summary, "status": status,
            "seen": seen, "p": p, "name": trainjob["metadata"]["name"]}  # fmt: skip


# --- a. 3 nodes x 1 process -----------------------------------------------------------------


@pytest.fixture(scope="module")
def trainjob_3x1(
    trainer_image: str, data_uri: str, docker_client: Any, gcs_container: Any, tmp_path_factory: Any
) -> dict[str, Any]:
    p = params(trainer_image, data_uri, "tj-3x1", workers=3, slots_per_worker=1)
    return run_trainjob(p, docker_client, gcs_container, tmp_path_factory.mktemp("tj-3x1"))


def test_3x1_launcher_as_node_0_forms_one_mpi_job_of_3(trainjob_3x1: dict[str, Any]) -> None:
    result: LauncherResult = trainjob_3x1["result"]
    assert result.exit_code == 0, result.log[-4000:]
    assert trainjob_3x1["status"][0] == "Completed", trainjob_3x1["status"]
    summary, name = trainjob_3x1["summary"], trainjob_3x1["name"]
    assert summary["world_size"] == summary["config"]["workers"] == 3
    assert summary["controller"] == "mpi"
    hosts = sorted(summary["hosts"])
    assert hosts == [f"{name}-launcher-0-0", f"{name}-node-0-0", f"{name}-node-0-1"], hosts


def test_3x1_exports_exactly_one_model_with_identical_weights(
    trainjob_3x1: dict[str, Any],
) -> None:
    p: ClusterJobParams = trainjob_3x1["p"]
    assert model_files(bucket_of(p.train.output)) == [f"{p.train.model_uri}/saved_model.pb"]
    summary = trainjob_3x1["summary"]
    assert summary["weights_identical_across_ranks"] is True
    assert len({r["weights_sha256"] for r in summary["per_rank"]}) == 1
    assert summary["coverage"]["disjoint"] and summary["coverage"]["covers_all"]


def test_3x1_logs_every_epoch_once_and_no_line_once_per_rank(
    trainjob_3x1: dict[str, Any],
) -> None:
    assert_epochs_once_and_no_line_per_rank(
        trainjob_3x1["result"].log, trainjob_3x1["p"].train.epochs
    )


def test_3x1_pods_see_what_trainer_lays_out(trainjob_3x1: dict[str, Any]) -> None:
    """Inside the launcher: the hostfile lists the node pods, then the launcher, by their
    JobSet endpoints; Open MPI's four variables; the SSH Secret's items root:fsGroup with
    their modes. Inside a node: the same key files, no hostfile, none of those variables."""
    name, seen = trainjob_3x1["name"], trainjob_3x1["seen"]
    ssh = "/home/mpiuser/.ssh"
    keys = [f"{ssh}/id_rsa 640 root:mpiuser", f"{ssh}/id_rsa.pub 644 root:mpiuser",
            f"{ssh}/authorized_keys 644 root:mpiuser"]  # fmt: skip
    assert seen["launcher"].splitlines() == [
        f"{name}-node-0-0.{name} slots=1",
        f"{name}-node-0-1.{name} slots=1",
        f"{name}-launcher-0-0.{name} slots=1",
        "OMPI_MCA_orte_default_hostfile=/etc/mpi/hostfile",
        "OMPI_MCA_orte_keep_fqdn_hostnames=true",
        "OMPI_MCA_orte_set_default_slots=1",
        "OMPI_MCA_plm_rsh_args=-o ConnectionAttempts=10",
        *keys,
    ], seen["launcher"]
    node = seen["node"].splitlines()
    assert "No such file or directory" in node[0] and node[1:] == ["0", *keys], node
    jobs = sorted(labels["jobset.sigs.k8s.io/replicatedjob-name"] for labels in seen["labels"])
    assert jobs == ["launcher", "node", "node"]
    assert {labels["jobset.sigs.k8s.io/jobset-name"] for labels in seen["labels"]} == {name}


# --- b. 2 nodes x 2 processes ---------------------------------------------------------------


def test_2x2_forms_one_job_of_4_and_one_model(
    trainer_image: str, data_uri: str, docker_client: Any, gcs_container: Any, tmp_path: Path
) -> None:
    p = params(trainer_image, data_uri, "tj-two-by-two", workers=2, slots_per_worker=2)
    job = run_trainjob(p, docker_client, gcs_container, tmp_path)
    assert job["result"].exit_code == 0, job["result"].log[-4000:]
    summary = job["summary"]
    assert (summary["world_size"], summary["controller"]) == (4, "mpi")
    assert sorted(r["local_rank"] for r in summary["per_rank"]) == [0, 0, 1, 1]
    assert sorted(summary["hosts"]) == [f"{job['name']}-launcher-0-0", f"{job['name']}-node-0-0"]
    assert model_files(bucket_of(p.train.output)) == [f"{p.train.model_uri}/saved_model.pb"]


# --- c. a node container killed mid-run -----------------------------------------------------


def test_killed_node_fails_the_trainjob_and_a_rerun_resumes(
    trainer_image: str, data_uri: str, docker_client: Any, gcs_container: Any, tmp_path: Path
) -> None:
    p = params(trainer_image, data_uri, "tj-killed", workers=3, epochs=30)  # ends well before 30
    checkpoint_uri = p.train.checkpoint_uri
    runtime, trainjob = build_manifests(p, NAMESPACE)
    with TrainJobRun(runtime, trainjob, docker_client, tmp_path / "1", emulator=gcs_container[0]) as job:  # fmt: skip  # noqa: E501
        job.start_nodes()
        job.wait_ready()
        job.start_launcher()
        seen = wait_for_checkpoint(checkpoint_uri, job)
        killed_at = time.monotonic()
        job.kill_node(1)
        result = job.wait_launcher(timeout=STALL_SECONDS + 120)
        detected_after = time.monotonic() - killed_at
        status = job.jobset_status()
        host = job.pod_name("node", 1)
    lost = [line for line in result.log.splitlines() if host in line]
    print(f"killed {host}; launcher exit {result.exit_code} {detected_after:.1f} s later; {status}")
    print("\n".join(lost[:6]))
    assert result.exit_code != 0
    assert status[0] == "Failed" and "node" in status[1], status
    assert detected_after < STALL_SECONDS, f"the job took {detected_after:.0f} s to fail"
    assert host in result.log, result.log[-3000:]
    # No model, and nothing half-written where the model goes (nor anywhere but the
    # checkpoint that may have been in flight).
    assert storage.list_files(p.train.model_uri) == []
    partial = half_written(bucket_of(p.train.output))
    assert all(f.startswith("tj-killed/checkpoints/") for f in partial), partial
    resume_from = checkpoints.latest(checkpoint_uri)
    assert resume_from is not None and seen <= resume_from.epoch < p.train.epochs, resume_from

    rerun = run_trainjob(p, docker_client, gcs_container, tmp_path / "2")
    assert rerun["result"].exit_code == 0, rerun["result"].log[-4000:]
    assert f"resuming from checkpoint after epoch {resume_from.epoch} of" in rerun["result"].log
    assert rerun["summary"]["resumed_from_epoch"] == resume_from.epoch
    assert model_files(bucket_of(p.train.output)) == [f"{p.train.model_uri}/saved_model.pb"]
