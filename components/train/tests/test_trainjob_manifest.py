"""The TrainingRuntime and TrainJob builders, their CRD-schema checks, and ``render-trainjob``."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from components.common import defaults
from components.train.cluster.crd import ManifestError
from components.train.cluster.params import ClusterJobParams, job_name
from components.train.config import TrainConfig
from components.train.mpijob.manifest import build_manifest
from components.train.trainjob.manifest import (
    ANCESTOR_LABEL,
    RUNTIME_SPEC_ANNOTATION,
    build_manifests,
    spec_digest,
    validate_manifests,
)
from pipeline.cli import cli


def params(**overrides: Any) -> ClusterJobParams:
    """A nightly run; `overrides` may name TrainConfig or ClusterJobParams fields."""
    train: dict[str, Any] = {"data": "gs://bkt/data", "output": "gs://bkt/runs/nightly"}
    pods: dict[str, Any] = {"run_name": "nightly", "pipeline_run_id": "run-42"}
    train_fields = set(TrainConfig.__dataclass_fields__)
    for key, value in overrides.items():
        (train if key in train_fields else pods)[key] = value
    return ClusterJobParams(train=TrainConfig(**train), **pods)


def jobs(runtime: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The runtime's replicated jobs by name, in order."""
    return {j["name"]: j for j in runtime["spec"]["template"]["spec"]["replicatedJobs"]}


def pod_spec(job: dict[str, Any]) -> dict[str, Any]:
    return dict(job["template"]["spec"]["template"]["spec"])


def test_the_runtime_runs_the_trainer_image_on_launcher_and_nodes_as_trainer_expects() -> None:
    runtime, trainjob = build_manifests(params(workers=3), "team-a")
    validate_manifests(runtime, trainjob)
    mpi = runtime["spec"]["mlPolicy"]["mpi"]
    assert mpi == {
        "numProcPerNode": 1, "mpiImplementation": "OpenMPI",
        "sshAuthMountPath": defaults.MPI_SSH_AUTH_MOUNT_PATH, "runLauncherAsNode": True,
    }  # fmt: skip
    assert runtime["spec"]["mlPolicy"]["numNodes"] == 1  # the launcher's own count
    by_name = jobs(runtime)
    assert list(by_name) == ["node", "launcher"]  # nodes first: dependsOn points backwards
    launcher, node = by_name["launcher"], by_name["node"]
    assert launcher["template"]["metadata"]["labels"] == {ANCESTOR_LABEL: "trainer"}
    assert ANCESTOR_LABEL not in node["template"].get("metadata", {}).get("labels", {})
    assert launcher["dependsOn"] == [{"name": "node", "status": "Ready"}]
    for job in (launcher, node):
        (container,) = pod_spec(job)["containers"]
        # Trainer mounts its SSH key, hostfile and variables into containers named "node" only
        assert (
            container["name"] == "node"
            and container["image"] == trainjob["spec"]["trainer"]["image"]
        )
        assert container["securityContext"]["runAsUser"] == defaults.MPI_USER_UID
        assert pod_spec(job)["securityContext"] == {"fsGroup": defaults.MPI_USER_UID}
        assert pod_spec(job)["restartPolicy"] == "Never"
    (sshd,) = pod_spec(node)["containers"]
    assert sshd["command"] == ["/usr/sbin/sshd"] and sshd["readinessProbe"]["tcpSocket"] == {
        "port": defaults.MPI_SSHD_PORT
    }
    spec = runtime["spec"]["template"]["spec"]
    assert spec["successPolicy"] == {"operator": "All", "targetReplicatedJobs": ["launcher"]}
    assert spec["failurePolicy"] == {"maxRestarts": defaults.JOB_BACKOFF_LIMIT}
    assert spec["ttlSecondsAfterFinished"] == defaults.JOB_TTL_SECONDS_AFTER_FINISHED


def test_the_trainjob_runs_the_mpijob_launchers_line_on_n_nodes_of_k_processes() -> None:
    p = params(workers=4, slots_per_worker=2, gpus_per_worker=2, cpu_per_worker="8")
    runtime, trainjob = build_manifests(p, "team-a")
    validate_manifests(runtime, trainjob)
    meta, trainer = trainjob["metadata"], trainjob["spec"]["trainer"]
    assert meta["name"] == job_name("nightly", "run-42") and meta["namespace"] == "team-a"
    assert meta["labels"]["pipeline/runid"] == "run-42"
    assert trainjob["spec"]["runtimeRef"] == {
        "name": runtime["metadata"]["name"], "apiGroup": "trainer.kubeflow.org",
        "kind": "TrainingRuntime",
    }  # fmt: skip
    assert (trainer["numNodes"], trainer["numProcPerNode"]) == (4, 2)
    mpijob_launcher = build_manifest(p)["spec"]["mpiReplicaSpecs"]["Launcher"]
    assert trainer["command"] == mpijob_launcher["template"]["spec"]["containers"][0]["command"]
    assert trainer["command"][trainer["command"].index("-np") + 1] == "8"  # 4 nodes x 2
    amounts = {"cpu": "8", "memory": defaults.WORKER_MEMORY, "nvidia.com/gpu": 2}
    assert trainer["resourcesPerNode"] == {"requests": amounts, "limits": amounts}
    assert trainer["env"] == [{"name": "PYTHONUNBUFFERED", "value": "1"}]
    assert trainjob["spec"]["activeDeadlineSeconds"] == defaults.JOB_ACTIVE_DEADLINE_SECONDS
    for job in jobs(runtime).values():  # the launcher is node 0: both tolerate GPU nodes
        assert pod_spec(job)["tolerations"][0]["key"] == "nvidia.com/gpu"


def test_runs_with_the_same_settings_share_one_runtime_and_other_settings_get_their_own() -> None:
    nightly, _ = build_manifests(params())
    other_run, _ = build_manifests(params(run_name="weekly", pipeline_run_id="r-9", workers=5))
    assert nightly == other_run  # run, size and resources are the TrainJob's, not the runtime's
    name = nightly["metadata"]["name"]
    assert name == f"kfp-horovod-{spec_digest(nightly['spec'])[:10]}"
    assert nightly["metadata"]["annotations"][RUNTIME_SPEC_ANNOTATION] == spec_digest(
        nightly["spec"]
    )
    names = {
        build_manifests(params(**change))[0]["metadata"]["name"]
        for change in ({}, {"image": "r/other:1"}, {"service_account": "sa"},
                       {"gpus_per_worker": 1}, {"backoff_limit": 2})
    }  # fmt: skip
    assert len(names) == 5


def test_what_a_trainjob_cannot_do_is_refused_all_at_once_by_name() -> None:
    with pytest.raises(ValueError) as info:
        build_manifests(
            params(workers=3, min_workers=2, queue="q", min_available=2, launcher_cpu="1")
        )
    text = str(info.value)
    assert "min_workers=2: elastic training needs mpi-operator's discover_hosts.sh" in text
    assert "queue is an MPIJob scheduling policy" in text
    assert "min_available is an MPIJob scheduling policy" in text
    assert "launcher_cpu does not apply to a TrainJob: its launcher is node 0" in text


def test_the_crds_refuse_typos_and_trainer_refuses_reserved_variables() -> None:
    runtime, trainjob = build_manifests(params())
    typo = copy.deepcopy(trainjob)
    typo["spec"]["trainer"]["numNode"] = typo["spec"]["trainer"].pop("numNodes")
    with pytest.raises(
        ManifestError, match=r"TrainJob .*spec\.trainer: .*'numNode' was unexpected"
    ):
        validate_manifests(runtime, typo)
    bad_runtime = copy.deepcopy(runtime)
    bad_runtime["spec"]["mlPolicy"]["mpi"]["mpiImplementation"] = "LAM"
    with pytest.raises(
        ManifestError, match=r"TrainingRuntime .*spec\.mlPolicy\.mpi\.mpiImplementation"
    ):
        validate_manifests(bad_runtime, trainjob)
    reserved = copy.deepcopy(trainjob)
    reserved["spec"]["trainer"]["env"].append({"name": "OMPI_MCA_plm_rsh_args", "value": "-v"})
    with pytest.raises(
        ManifestError, match="OMPI_MCA_plm_rsh_args is reserved by Kubeflow Trainer"
    ):
        validate_manifests(runtime, reserved)


def test_render_trainjob_prints_the_two_valid_manifests() -> None:
    args = ["render-trainjob", "--workers", "3", "--slots-per-worker", "2", "--run-name", "n7",
            "--pipeline-run-id", "r-1", "--namespace", "team-a", "--data", "gs://b/data",
            "--output", "gs://b/out", "--service-account", "trainer"]  # fmt: skip
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    runtime, trainjob = yaml.safe_load_all(result.output)
    validate_manifests(runtime, trainjob)
    expected = build_manifests(
        ClusterJobParams(
            train=TrainConfig(
                data="gs://b/data", output="gs://b/out", workers=3, slots_per_worker=2
            ),
            run_name="n7", pipeline_run_id="r-1", service_account="trainer",
        ),
        "team-a",
    )  # fmt: skip
    assert (runtime, trainjob) == expected


@pytest.mark.parametrize(
    ("args", "message"),
    [(["--min-workers", "1"], "elastic training needs mpi-operator's discover_hosts.sh"),
     (["--data", "/tmp/data"], "data must be a gs:// URI for a cluster backend"),
     (["--queue", "q"], "No such option '--queue'")],
)  # fmt: skip
def test_render_trainjob_refuses_what_a_trainjob_cannot_do(args: list[str], message: str) -> None:
    result = CliRunner().invoke(cli, ["render-trainjob", "--workers", "2", *args])
    assert result.exit_code == 2 and message in result.output, result.output
