"""Unit tests of the pure MPIJob manifest builder and its CRD-schema check."""

from __future__ import annotations

import copy
import dataclasses
import re
from typing import Any

import pytest

from components.common import defaults
from components.train.cluster.crd import ManifestError
from components.train.cluster.params import (
    LABEL_RUN_ID,
    MAX_NAME_LENGTH,
    ClusterJobParams,
    job_name,
    sanitize_name,
)
from components.train.cluster.pods import launcher_command
from components.train.config import TrainConfig
from components.train.mpijob.manifest import LABEL_JOB, LABEL_ROLE, build_manifest
from components.train.mpijob.validate import mpijob_problems, validate_manifest

DNS_1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")


def params(**overrides: Any) -> ClusterJobParams:
    """ClusterJobParams of a nightly run; `overrides` may name TrainConfig or ClusterJobParams
    fields."""
    train: dict[str, Any] = {
        "data": "gs://bkt/data",
        "output": "gs://bkt/runs/nightly",
        "workers": defaults.WORKERS,
    }
    pods: dict[str, Any] = {"run_name": "nightly", "pipeline_run_id": "0b5e-run-42"}
    for name, value in overrides.items():
        (train if name in fields_of(TrainConfig) else pods)[name] = value
    return ClusterJobParams(train=TrainConfig(**train), **pods)


def fields_of(cls: type) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)}


def containers(manifest: dict, role: str) -> dict:
    spec = manifest["spec"]["mpiReplicaSpecs"][role]["template"]["spec"]
    assert len(spec["containers"]) == 1
    return spec["containers"][0]


@pytest.mark.parametrize(
    "run_name",
    [
        "nightly",
        "My Run_2024/07 (retry)",
        "UPPER.case.dots",
        "123-starts-with-digits",
        "---",
        "ü" * 10,
        "a" * 200,
        "x-",
    ],
)
def test_job_name_is_dns_1035_and_short(run_name: str) -> None:
    name = job_name(run_name, "run-id")
    assert DNS_1035.match(name), name
    assert len(name) <= MAX_NAME_LENGTH
    assert name.startswith("hvd-")
    # deterministic: a retried task computes the same name
    assert job_name(run_name, "run-id") == name


def test_job_name_keeps_the_readable_part_and_separates_runs() -> None:
    assert job_name("My Run_2024", "r1").startswith("hvd-my-run-2024-")
    assert job_name("same", "r1") != job_name("same", "r2")
    # two runs whose slugs collide still get different names
    assert job_name("a b", "r1") != job_name("a-b", "r1")
    assert sanitize_name("123abc") == "abc"
    assert sanitize_name("!!!") == ""


def test_manifest_basics_and_validates() -> None:
    m = build_manifest(params(), namespace="team-a")
    validate_manifest(m)
    assert m["apiVersion"] == "kubeflow.org/v2beta1" and m["kind"] == "MPIJob"
    meta = m["metadata"]
    assert meta["namespace"] == "team-a"
    assert meta["name"] == job_name("nightly", "0b5e-run-42")
    assert meta["labels"][LABEL_RUN_ID] == "0b5e-run-42"
    spec = m["spec"]
    assert spec["launcherCreationPolicy"] == "WaitForWorkersReady"
    assert spec["sshAuthMountPath"] == defaults.MPI_SSH_AUTH_MOUNT_PATH
    assert spec["runPolicy"] == {
        "cleanPodPolicy": "Running",
        "ttlSecondsAfterFinished": defaults.JOB_TTL_SECONDS_AFTER_FINISHED,
        "backoffLimit": defaults.JOB_BACKOFF_LIMIT,
        "activeDeadlineSeconds": defaults.JOB_ACTIVE_DEADLINE_SECONDS,
    }
    assert spec["mpiReplicaSpecs"]["Launcher"]["replicas"] == 1
    assert spec["mpiReplicaSpecs"]["Worker"]["replicas"] == defaults.WORKERS
    for role in ("Launcher", "Worker"):
        template = spec["mpiReplicaSpecs"][role]["template"]
        assert template["metadata"]["labels"][LABEL_JOB] == meta["name"]
        assert template["metadata"]["labels"][LABEL_ROLE] == role.lower()
        sc = containers(m, role)["securityContext"]
        assert sc["runAsNonRoot"] is True and sc["runAsUser"] == defaults.MPI_USER_UID
        assert containers(m, role)["image"] == defaults.image_ref("trainer")
    worker = containers(m, "Worker")
    assert worker["command"] == ["/usr/sbin/sshd"]
    assert worker["args"] == ["-De", "-f", defaults.MPI_SSHD_CONFIG]
    assert worker["readinessProbe"]["tcpSocket"]["port"] == defaults.MPI_SSHD_PORT
    assert "ownerReferences" not in meta
    assert "schedulingPolicy" not in spec["runPolicy"]


@pytest.mark.parametrize(("workers", "slots"), [(1, 1), (2, 1), (3, 2), (4, 8)])
def test_expected_workers_is_workers_times_slots(workers: int, slots: int) -> None:
    p = params(workers=workers, slots_per_worker=slots)
    m = build_manifest(p)
    validate_manifest(m)
    cmd = containers(m, "Launcher")["command"]
    watch, mpirun = cmd[: cmd.index("--")], cmd[cmd.index("--") + 1 :]
    assert watch == ["python", "-m", "components.train.mpiwatch", "--ranks", str(workers * slots),
                     "--silence-seconds", str(defaults.STALL_SHUTDOWN_SECONDS)]  # fmt: skip
    assert mpirun[:4] == ["mpirun", "-np", str(workers * slots), "--tag-output"]
    trainer = cmd[cmd.index("components.train") - 2 :]
    assert trainer[:3] == ["python", "-m", "components.train"]

    def flag(name: str, default: str) -> str:
        return trainer[trainer.index(name) + 1] if name in trainer else default

    assert (flag("--workers", "2"), flag("--slots-per-worker", "1")) == (str(workers), str(slots))
    assert m["spec"]["slotsPerWorker"] == slots
    assert m["spec"]["mpiReplicaSpecs"]["Worker"]["replicas"] == workers


def test_trainer_reads_and_writes_gcs_directly() -> None:
    p = params(
        model_dir="gs://bkt/models/m1",
        epochs=7,
        batch_size_per_worker=32,
        learning_rate=0.01,
        warmup_epochs=2,
        threads_per_worker=3,
        seed=5,
        model="team.models:build",
        augment=True,
        stall_shutdown_seconds=99,
    )
    cmd = launcher_command(p)
    trainer = cmd[cmd.index("components.train") - 2 :]

    def flag(name: str) -> str:
        return trainer[trainer.index(name) + 1]

    assert flag("--data") == "gs://bkt/data"
    assert flag("--output") == "gs://bkt/runs/nightly"
    assert flag("--model-dir") == "gs://bkt/models/m1"
    assert (flag("--epochs"), flag("--batch-size-per-worker"), flag("--seed")) == ("7", "32", "5")
    assert float(flag("--learning-rate")) == 0.01
    assert (flag("--warmup-epochs"), flag("--threads-per-worker")) == ("2", "3")
    assert flag("--model") == "team.models:build" and "--augment" in trainer
    assert "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS=99" in cmd
    assert p.train.model_uri == "gs://bkt/models/m1"
    # without --model-dir the trainer's default applies, and no --model-dir flag is passed
    plain = params()
    assert "--model-dir" not in launcher_command(plain)
    assert "--threads-per-worker" not in launcher_command(plain)
    assert "--augment" not in launcher_command(plain)
    assert "--model" not in launcher_command(plain)  # the trainer's default: from_argv restores it
    assert plain.train.model_uri == "gs://bkt/runs/nightly/model"


def test_resources_requests_equal_limits_and_gpu() -> None:
    m = build_manifest(params(cpu_per_worker="3500m", memory_per_worker="12Gi"))
    validate_manifest(m)
    res = containers(m, "Worker")["resources"]
    assert res["requests"] == res["limits"] == {"cpu": "3500m", "memory": "12Gi"}
    assert "tolerations" not in m["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]

    g = build_manifest(params(gpus_per_worker=2, slots_per_worker=2))
    validate_manifest(g)
    res = containers(g, "Worker")["resources"]
    assert res["requests"]["nvidia.com/gpu"] == res["limits"]["nvidia.com/gpu"] == 2
    tolerations = g["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]["tolerations"]
    assert tolerations[0]["key"] == "nvidia.com/gpu"
    # the launcher only runs mpirun: no GPU
    assert "nvidia.com/gpu" not in containers(g, "Launcher")["resources"]["limits"]


def test_scheduling_policy_and_identity() -> None:
    p = params(
        queue="training",
        priority_class="batch-high",
        min_available=3,
        scheduler_name="volcano",
        service_account="trainer-ksa",
        owner_pod_name="pipeline-abc-123",
        owner_pod_uid="0000-1111",
        ttl_seconds_after_finished=60,
        backoff_limit=2,
        active_deadline_seconds=7200,
    )
    m = build_manifest(p)
    validate_manifest(m)
    assert m["spec"]["runPolicy"]["schedulingPolicy"] == {
        "queue": "training",
        "priorityClass": "batch-high",
        "minAvailable": 3,
    }
    assert m["spec"]["runPolicy"]["ttlSecondsAfterFinished"] == 60
    assert m["spec"]["runPolicy"]["backoffLimit"] == 2
    assert m["spec"]["runPolicy"]["activeDeadlineSeconds"] == 7200
    for role in ("Launcher", "Worker"):
        pod = m["spec"]["mpiReplicaSpecs"][role]["template"]["spec"]
        assert pod["serviceAccountName"] == "trainer-ksa"
        assert pod["priorityClassName"] == "batch-high"
        assert pod["schedulerName"] == "volcano"
    (ref,) = m["metadata"]["ownerReferences"]
    assert (ref["kind"], ref["name"], ref["uid"]) == ("Pod", "pipeline-abc-123", "0000-1111")


@pytest.mark.parametrize(
    ("overrides", "names"),
    [
        ({"workers": 0}, "workers"),
        ({"slots_per_worker": 0}, "slots_per_worker"),
        ({"data": "/mnt/data"}, "data"),
        ({"output": "s3://bkt/out"}, "output"),
        ({"model_dir": "/tmp/model"}, "model_dir"),
        ({"run_name": "  "}, "run_name"),
        ({"epochs": 0}, "epochs"),
        ({"batch_size_per_worker": -1}, "batch_size_per_worker"),
        ({"learning_rate": 0.0}, "learning_rate"),
        ({"warmup_epochs": -1}, "warmup_epochs"),
        ({"threads_per_worker": -1}, "threads_per_worker"),
        ({"launcher_cpu": "0"}, "launcher_cpu"),
        ({"stall_shutdown_seconds": 0}, "stall_shutdown_seconds"),
        ({"cpu_per_worker": "two"}, "cpu_per_worker"),
        ({"memory_per_worker": "0Gi"}, "memory_per_worker"),
        ({"gpus_per_worker": -1}, "gpus_per_worker"),
        ({"ttl_seconds_after_finished": -1}, "ttl_seconds_after_finished"),
        ({"backoff_limit": -1}, "backoff_limit"),
        ({"active_deadline_seconds": 0}, "active_deadline_seconds"),
        ({"min_available": 9, "workers": 2}, "min_available"),
        ({"queue": "Bad Queue"}, "queue"),
        ({"service_account": "SA_x"}, "service_account"),
        ({"owner_pod_uid": "u"}, "owner_pod_uid"),
        ({"image": "has space:1"}, "image"),
    ],
)
def test_bad_parameters_are_named(overrides: dict, names: str) -> None:
    with pytest.raises(ValueError, match=rf"\b{names}\b"):
        params(**overrides)


def test_all_problems_reported_at_once() -> None:
    with pytest.raises(ValueError) as info:
        params(workers=0, epochs=0, learning_rate=11.0)
    assert "workers must be >= 1, got 0" in str(info.value)
    assert "epochs must be >= 1, got 0" in str(info.value)
    assert "learning_rate must be <= 10, got 11.0" in str(info.value)
    with pytest.raises(ValueError) as info:
        params(data="data", cpu_per_worker="1K", backoff_limit=-1)
    assert "data must be a gs:// URI" in str(info.value)
    assert "cpu_per_worker must be a positive Kubernetes quantity" in str(info.value)
    assert "backoff_limit must be >= 0, got -1" in str(info.value)
    with pytest.raises(ValueError) as info:  # a TrainConfig field since the trainer checks GPUs
        params(gpus_per_worker=-1, slots_per_worker=0)
    assert "gpus_per_worker must be >= 0, got -1" in str(info.value)
    assert "slots_per_worker must be >= 1, got 0" in str(info.value)


def test_each_rank_of_a_gpu_worker_needs_a_gpu_of_its_own() -> None:
    with pytest.raises(ValueError) as info:
        params(gpus_per_worker=1, slots_per_worker=2)
    assert (
        "gpus_per_worker must be 0 (CPU) or >= slots_per_worker (each of a worker's ranks trains "
        "on a GPU of its own), got 1 < 2"
    ) in str(info.value)
    assert launcher_command(params(gpus_per_worker=2, slots_per_worker=2))[-2:] == [
        "--gpus-per-worker", "2",
    ]  # fmt: skip  # every rank is told, and checks it has its GPU


def test_schema_refuses_typos_wrong_types_and_bad_policy() -> None:
    good = build_manifest(params())
    assert mpijob_problems(good) == []

    typo = copy.deepcopy(good)
    typo["spec"]["slotPerWorker"] = typo["spec"].pop("slotsPerWorker")
    with pytest.raises(ManifestError, match=r"spec: .*'slotPerWorker' was unexpected"):
        validate_manifest(typo)

    wrong_type = copy.deepcopy(good)
    wrong_type["spec"]["mpiReplicaSpecs"]["Worker"]["replicas"] = "two"
    with pytest.raises(ManifestError, match=r"spec\.mpiReplicaSpecs\.Worker\.replicas: 'two'"):
        validate_manifest(wrong_type)

    bad_impl = copy.deepcopy(good)
    bad_impl["spec"]["mpiImplementation"] = "LAM"
    with pytest.raises(ManifestError, match=r"spec\.mpiImplementation"):
        validate_manifest(bad_impl)

    bad_policy = copy.deepcopy(good)
    bad_policy["spec"]["launcherCreationPolicy"] = "Eventually"
    with pytest.raises(ManifestError, match=r"spec\.launcherCreationPolicy"):
        validate_manifest(bad_policy)

    no_specs = copy.deepcopy(good)
    del no_specs["spec"]["mpiReplicaSpecs"]
    with pytest.raises(ManifestError, match=r"'mpiReplicaSpecs' is a required property"):
        validate_manifest(no_specs)

    bad_container = copy.deepcopy(good)
    bad_container["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0][
        "imagePullPolice"
    ] = "Always"
    with pytest.raises(ManifestError, match=r"containers\.0: .*'imagePullPolice'"):
        validate_manifest(bad_container)

    wrong_kind = copy.deepcopy(good)
    wrong_kind["kind"] = "TFJob"
    with pytest.raises(ManifestError, match=r"kind: expected MPIJob"):
        validate_manifest(wrong_kind)


def test_launcher_leaves_the_btl_choice_to_the_image() -> None:
    """The trainer image's Open MPI config excludes uct, openib and ofi; a ``-mca btl`` list on
    the command line would replace that list (``^openib`` re-enabled uct and ofi)."""
    cmd = launcher_command(params())
    mca = [cmd[i + 1] for i, word in enumerate(cmd) if word in ("-mca", "--mca")]
    assert "btl" not in mca
    assert not any(word.startswith("OMPI_MCA_btl=") for word in cmd)


def test_elastic_job_runs_elastic_horovodrun_on_the_operators_discovery_script() -> None:
    m = build_manifest(
        params(workers=4, slots_per_worker=2, min_workers=3, stall_shutdown_seconds=77)
    )
    validate_manifest(m)
    launcher = containers(m, "Launcher")
    cmd = launcher["command"]
    assert cmd[:3] == ["python", "-m", "components.train.launch"]  # horovodrun's command line

    def flag(name: str) -> str:
        return cmd[cmd.index(name) + 1]

    # ranks: 4 workers x 2 slots at most, 3 x 2 at least; slots per discovered host: 2
    assert (flag("-np"), flag("--min-np"), flag("--max-np"), flag("--slots")) == (
        "8",
        "6",
        "8",
        "2",
    )
    assert flag("--host-discovery-script") == "/etc/mpi/discover_hosts.sh"
    assert "mpirun" not in cmd and "--gloo" in cmd
    trainer = cmd[cmd.index("components.train") + 1 :]
    assert trainer[trainer.index("--min-workers") + 1] == "3"
    assert trainer[trainer.index("--workers") + 1] == "4"  # 4 workers x 2 slots: 8 ranks
    assert trainer[trainer.index("--slots-per-worker") + 1] == "2"
    env = {e["name"]: e["value"] for e in launcher["env"]}
    assert env == {"PYTHONUNBUFFERED": "1", "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": "77"}
    assert m["spec"]["mpiReplicaSpecs"]["Worker"]["replicas"] == 4


def test_static_job_runs_mpirun_under_the_heartbeat_watch_and_no_launcher_env() -> None:
    launcher = containers(build_manifest(params(workers=3)), "Launcher")
    cmd = launcher["command"]
    assert cmd[:3] == ["python", "-m", "components.train.mpiwatch"] and "env" not in launcher
    assert cmd[cmd.index("--") + 1] == "mpirun" and "--min-workers" not in cmd


@pytest.mark.parametrize(("stall", "period"), [(120, "5"), (20, "5"), (8, "2"), (1, "0.25")])
def test_the_watch_bound_is_the_stall_bound_and_the_ranks_beat_four_times_in_it(
    stall: int, period: str
) -> None:
    """The watch ends the job after ``stall_shutdown_seconds`` of silence; mpirun forwards the
    heartbeat period to the ranks: 5 s, or a quarter of the bound if that is less."""
    cmd = launcher_command(params(workers=2, stall_shutdown_seconds=stall))
    assert cmd[cmd.index("--silence-seconds") + 1] == str(stall)
    mpirun = cmd[cmd.index("--") + 1 : cmd.index("components.train")]
    exported = [mpirun[i + 1] for i, word in enumerate(mpirun) if word == "-x"]
    assert f"KFP_HOROVOD_HEARTBEAT_SECONDS={period}" in exported
    assert f"HOROVOD_STALL_SHUTDOWN_TIME_SECONDS={stall}" in exported


@pytest.mark.parametrize(
    ("overrides", "message"),
    [({"workers": 2, "min_workers": 3}, "min_workers must be <= workers"),
     ({"workers": 2, "min_workers": -1}, "min_workers must be >= 0")],
)  # fmt: skip
def test_bad_min_workers_is_refused_by_name(overrides: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        params(**overrides)
