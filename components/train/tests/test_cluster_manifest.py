"""The pure manifest builders of both backends and their CRD-schema checks: the job's name and
parameters, the launcher's command (the same on both), the MPIJob, and the TrainingRuntime and
TrainJob."""

from __future__ import annotations

import copy
import re
from typing import Any

import pytest

from components.common import defaults
from components.common.crd import ManifestError
from components.train.launcher.cluster.job import (
    LABEL_RUN_ID,
    MAX_NAME_LENGTH,
    SPEC_ANNOTATION,
    check_manifests,
    job_kind,
    job_name,
    sanitize_name,
    validated,
)
from components.train.launcher.cluster.mpijob import LABEL_JOB, build_manifest
from components.train.launcher.cluster.pods import launcher_command
from components.train.launcher.cluster.trainjob import ANCESTOR_LABEL, spec_digest
from components.train.tests.cluster_jobs import make_params

DNS_1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")


def params(**overrides: Any) -> Any:
    """A nightly run of the default size; `overrides` name any part's fields."""
    return make_params(
        **{
            "workers": defaults.WORKERS,
            "slots_per_worker": 1,
            "pipeline_run_id": "0b5e-run-42",
            **overrides,
        }
    )


def container(manifest: dict[str, Any], role: str) -> dict[str, Any]:
    spec = manifest["spec"]["mpiReplicaSpecs"][role]["template"]["spec"]
    (only,) = spec["containers"]
    return only  # type: ignore[no-any-return]


def mpijob(**overrides: Any) -> dict[str, Any]:
    """The MPIJob of `params(**overrides)`, checked against its CRD."""
    (manifest,), _ = validated(job_kind("mpijob"), params(**overrides))
    return manifest


def trainjob(**overrides: Any) -> list[dict[str, Any]]:
    """The TrainingRuntime and TrainJob of `params(**overrides)` in team-a, checked."""
    return validated(job_kind("trainjob"), params(**overrides), "team-a")[0]


def flag(command: list[str], name: str, default: str | None = None) -> str | None:
    """The value after `name` in the trainer's part of `command`."""
    trainer = command[command.index("components.train.rank") :]
    return trainer[trainer.index(name) + 1] if name in trainer else default


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
def test_job_name_is_dns_1035_short_and_deterministic(run_name: str) -> None:
    name = job_name(run_name, "run-id")
    assert DNS_1035.match(name) and len(name) <= MAX_NAME_LENGTH and name.startswith("hvd-")
    assert job_name(run_name, "run-id") == name  # a retried task computes the same name


def test_job_name_keeps_the_readable_part_and_separates_runs() -> None:
    assert job_name("My Run_2024", "r1").startswith("hvd-my-run-2024-")
    assert job_name("same", "r1") != job_name("same", "r2")
    assert job_name("a b", "r1") != job_name("a-b", "r1")  # slugs collide, names do not
    assert (sanitize_name("123abc"), sanitize_name("!!!")) == ("abc", "")


@pytest.mark.parametrize(  # data, min_available, cpu_per_worker, backoff_limit: the next test
    "bad",  # the trainer's own fields: test_config.py; run_name: test_cluster_render.py
    [
        {"output": "s3://bkt/out"},
        {"model_dir": "/tmp/model"},
        {"launcher_cpu": "0"},
        {"stall_shutdown_seconds": 0},
        {"memory_per_worker": "0Gi"},
        {"ttl_seconds_after_finished": -1},
        {"active_deadline_seconds": 0},
        {"queue": "Bad Queue"},
        {"trainer_service_account": "SA_x"},
        {"trainer_image": "has space:1"},
    ],
)
def test_bad_parameters_are_named(bad: dict[str, Any]) -> None:
    (name,) = bad
    with pytest.raises(ValueError, match=rf"\b{name}\b"):
        params(**bad)


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (
            {"workers": 0, "epochs": 0, "learning_rate": 11.0},
            [
                "workers must be >= 1, got 0",
                "epochs must be >= 1, got 0",
                "learning_rate must be <= 10, got 11.0",
            ],
        ),
        (
            {"data": "data", "min_available": 9},
            ["data must be a gs:// URI", "min_available must be <= workers + 1 launcher"],
        ),
        (
            {"gpus_per_worker": -1, "slots_per_worker": 0},  # the trainer checks the GPUs
            ["gpus_per_worker must be >= 0, got -1", "slots_per_worker must be >= 1, got 0"],
        ),
        (
            {"cpu_per_worker": "1K", "backoff_limit": -1},  # the train step's own fields
            [
                "cpu_per_worker must be a positive Kubernetes quantity",
                "backoff_limit must be >= 0, got -1",
            ],
        ),
    ],
)
def test_all_problems_are_reported_at_once(overrides: dict[str, Any], expected: list[str]) -> None:
    with pytest.raises(ValueError) as info:
        params(**overrides)
    assert [line for line in expected if line not in str(info.value)] == [], info.value


@pytest.mark.parametrize(("workers", "slots"), [(1, 1), (2, 1), (3, 2), (4, 8)])
def test_the_launcher_runs_mpirun_of_workers_times_slots_under_the_heartbeat_watch(
    workers: int, slots: int
) -> None:
    m = mpijob(workers=workers, slots_per_worker=slots)
    cmd = container(m, "Launcher")["command"]
    watch, mpirun = cmd[: cmd.index("--")], cmd[cmd.index("--") + 1 :]
    assert watch == [
        "python",
        "-m",
        "components.train.launcher.mpiwatch",
        "--ranks",
        str(workers * slots),
        "--silence-seconds",
        str(defaults.STALL_SHUTDOWN_SECONDS),
    ]
    assert mpirun[:4] == ["mpirun", "-np", str(workers * slots), "--tag-output"]
    assert cmd[cmd.index("components.train.rank") - 2 :][:3] == [
        "python",
        "-m",
        "components.train.rank",
    ]
    assert (flag(cmd, "--workers", "2"), flag(cmd, "--slots-per-worker", "1")) == (
        str(workers),
        str(slots),
    )
    assert "--min-workers" not in cmd
    assert m["spec"]["slotsPerWorker"] == slots
    assert m["spec"]["mpiReplicaSpecs"]["Worker"]["replicas"] == workers
    # the image's Open MPI excludes uct, openib and ofi; a -mca btl list would replace that
    mca = [cmd[i + 1] for i, word in enumerate(cmd) if word in ("-mca", "--mca")]
    assert "btl" not in mca and not any(w.startswith("OMPI_MCA_btl=") for w in cmd)


def test_the_trainer_reads_and_writes_gcs_directly_with_the_runs_settings() -> None:
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
    )
    cmd = launcher_command(p)
    given = {
        "--data": "gs://bkt/data",
        "--output": "gs://bkt/runs/nightly",
        "--model-dir": "gs://bkt/models/m1",
        "--epochs": "7",
        "--batch-size-per-worker": "32",
        "--seed": "5",
        "--warmup-epochs": "2",
        "--threads-per-worker": "3",
        "--model": "team.models:build",
    }
    assert {name: flag(cmd, name) for name in given} == given and "--augment" in cmd
    assert float(flag(cmd, "--learning-rate") or 0) == 0.01
    assert p.train.model_uri == "gs://bkt/models/m1"
    # defaults are not passed: the trainer's own (from_argv) apply
    plain = launcher_command(params())
    for name in ("--model-dir", "--threads-per-worker", "--augment", "--model"):
        assert name not in plain
    assert params().train.model_uri == "gs://bkt/runs/nightly/model"
    gpu = launcher_command(params(gpus_per_worker=2, slots_per_worker=2))
    assert gpu[-2:] == ["--gpus-per-worker", "2"]  # every rank is told, and checks its GPU


@pytest.mark.parametrize(("stall", "period"), [(120, "5"), (20, "5"), (8, "2"), (1, "0.25")])
def test_the_watch_bound_is_the_stall_bound_and_the_ranks_beat_four_times_in_it(
    stall: int, period: str
) -> None:
    """The watch ends the job after ``stall_shutdown_seconds`` of silence; mpirun forwards the
    heartbeat period to the ranks (5 s, or a quarter of the bound if that is less) with the
    job's environment, which the launcher container has too."""
    m = mpijob(workers=2, stall_shutdown_seconds=stall)
    launcher = container(m, "Launcher")
    cmd = launcher["command"]
    assert cmd[cmd.index("--silence-seconds") + 1] == str(stall)
    mpirun = cmd[cmd.index("--") + 1 : cmd.index("components.train.rank")]
    exported = [mpirun[i + 1] for i, word in enumerate(mpirun) if word == "-x"]
    env = {"PYTHONUNBUFFERED": "1", "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": str(stall)}
    assert exported == [
        "PATH",
        *(f"{k}={v}" for k, v in env.items()),
        f"KFP_HOROVOD_HEARTBEAT_SECONDS={period}",
    ]
    assert {e["name"]: e["value"] for e in launcher["env"]} == env


def test_an_elastic_mpijob_runs_elastic_horovodrun_on_the_operators_discovery_script() -> None:
    m = mpijob(workers=4, slots_per_worker=2, min_workers=3, stall_shutdown_seconds=77)
    launcher = container(m, "Launcher")
    cmd = launcher["command"]
    assert cmd[:3] == [
        "python",
        "-m",
        "components.train.launcher.launch",
    ]  # horovodrun's command line

    # ranks: 4 workers x 2 slots at most, 3 x 2 at least; slots per discovered host: 2
    options = {
        "-np": "8",
        "--min-np": "6",
        "--max-np": "8",
        "--slots": "2",
        "--host-discovery-script": "/etc/mpi/discover_hosts.sh",
    }
    assert {name: cmd[cmd.index(name) + 1] for name in options} == options
    assert "mpirun" not in cmd and "--gloo" in cmd
    assert (flag(cmd, "--min-workers"), flag(cmd, "--workers")) == ("3", "4")
    assert flag(cmd, "--slots-per-worker") == "2"
    env = {e["name"]: e["value"] for e in launcher["env"]}  # horovodrun passes it on
    assert env == {"PYTHONUNBUFFERED": "1", "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": "77"}
    assert m["spec"]["mpiReplicaSpecs"]["Worker"]["replicas"] == 4


def test_the_mpijob_basics_resources_scheduling_and_identity() -> None:
    m = build_manifest(params(), namespace="team-a")
    assert (m["apiVersion"], m["kind"]) == ("kubeflow.org/v2beta1", "MPIJob")
    meta, spec = m["metadata"], m["spec"]
    assert meta["namespace"] == "team-a" and meta["name"] == job_name("nightly", "0b5e-run-42")
    assert meta["labels"][LABEL_RUN_ID] == "0b5e-run-42" and "ownerReferences" not in meta
    assert spec["launcherCreationPolicy"] == "WaitForWorkersReady"
    assert spec["sshAuthMountPath"] == defaults.MPI_SSH_AUTH_MOUNT_PATH
    assert spec["runPolicy"] == {
        "cleanPodPolicy": "Running",
        "ttlSecondsAfterFinished": defaults.JOB_TTL_SECONDS_AFTER_FINISHED,
        "backoffLimit": defaults.JOB_BACKOFF_LIMIT,
        "activeDeadlineSeconds": defaults.JOB_ACTIVE_DEADLINE_SECONDS,
    }
    assert spec["mpiReplicaSpecs"]["Launcher"]["replicas"] == 1
    for role in ("Launcher", "Worker"):
        template = spec["mpiReplicaSpecs"][role]["template"]
        assert template["metadata"]["labels"][LABEL_JOB] == meta["name"]
        assert template["metadata"]["labels"]["kfp-horovod/role"] == role.lower()
        sc = container(m, role)["securityContext"]
        assert sc["runAsNonRoot"] is True and sc["runAsUser"] == defaults.MPI_USER_UID
        assert template["spec"]["serviceAccountName"] == defaults.TRAINER_SERVICE_ACCOUNT
    worker = container(m, "Worker")
    assert worker["command"] == ["/usr/sbin/sshd"]
    assert worker["args"] == ["-De", "-f", defaults.MPI_SSHD_CONFIG]
    assert worker["readinessProbe"]["tcpSocket"]["port"] == defaults.MPI_SSHD_PORT
    res = worker["resources"]
    assert res["requests"] == res["limits"] == {"cpu": "2", "memory": defaults.WORKER_MEMORY}

    g = mpijob(
        gpus_per_worker=2,
        slots_per_worker=2,
        cpu_per_worker="3500m",
        queue="training",
        priority_class="batch-high",
        min_available=3,
        scheduler_name="volcano",
        trainer_service_account="trainer-ksa",
        ttl_seconds_after_finished=60,
        backoff_limit=2,
        active_deadline_seconds=7200,
    )
    res = container(g, "Worker")["resources"]
    assert (
        res["requests"]
        == res["limits"]
        == {
            "cpu": "3500m",
            "memory": defaults.WORKER_MEMORY,
            "nvidia.com/gpu": 2,
        }
    )
    assert "nvidia.com/gpu" not in container(g, "Launcher")["resources"]["limits"]  # mpirun only
    assert g["spec"]["runPolicy"] == {
        "cleanPodPolicy": "Running",
        "ttlSecondsAfterFinished": 60,
        "backoffLimit": 2,
        "activeDeadlineSeconds": 7200,
        "schedulingPolicy": {"queue": "training", "priorityClass": "batch-high", "minAvailable": 3},
    }
    for role in ("Launcher", "Worker"):
        pod = g["spec"]["mpiReplicaSpecs"][role]["template"]["spec"]
        assert (pod["serviceAccountName"], pod["priorityClassName"], pod["schedulerName"]) == (
            "trainer-ksa",
            "batch-high",
            "volcano",
        )


def test_the_runtime_runs_the_trainer_image_on_launcher_and_nodes_as_trainer_expects() -> None:
    runtime, job = trainjob(workers=3)
    assert runtime["spec"]["mlPolicy"] == {
        "numNodes": 1,  # the launcher's own count
        "mpi": {
            "numProcPerNode": 1,
            "mpiImplementation": "OpenMPI",
            "sshAuthMountPath": defaults.MPI_SSH_AUTH_MOUNT_PATH,
            "runLauncherAsNode": True,
        },
    }
    spec = runtime["spec"]["template"]["spec"]
    by_name = {j["name"]: j for j in spec["replicatedJobs"]}
    assert list(by_name) == ["node", "launcher"]  # nodes first: dependsOn points backwards
    launcher, node = by_name["launcher"], by_name["node"]
    assert launcher["template"]["metadata"]["labels"] == {ANCESTOR_LABEL: "trainer"}
    assert ANCESTOR_LABEL not in node["template"].get("metadata", {}).get("labels", {})
    assert launcher["dependsOn"] == [{"name": "node", "status": "Ready"}]
    for j in (launcher, node):
        pod = j["template"]["spec"]["template"]["spec"]
        (c,) = pod["containers"]  # Trainer mounts its SSH files into containers named "node"
        assert c["name"] == "node" and c["image"] == job["spec"]["trainer"]["image"]
        assert c["securityContext"]["runAsUser"] == defaults.MPI_USER_UID
        assert pod["securityContext"] == {"fsGroup": defaults.MPI_USER_UID}
        assert pod["restartPolicy"] == "Never"
    (sshd,) = node["template"]["spec"]["template"]["spec"]["containers"]
    assert sshd["command"] == ["/usr/sbin/sshd"]
    assert sshd["readinessProbe"]["tcpSocket"] == {"port": defaults.MPI_SSHD_PORT}
    assert spec["successPolicy"] == {"operator": "All", "targetReplicatedJobs": ["launcher"]}
    assert spec["failurePolicy"] == {"maxRestarts": defaults.JOB_BACKOFF_LIMIT}
    assert spec["ttlSecondsAfterFinished"] == defaults.JOB_TTL_SECONDS_AFTER_FINISHED


def test_the_trainjob_runs_the_mpijob_launchers_line_on_n_nodes_of_k_processes() -> None:
    sized = {"workers": 4, "slots_per_worker": 2, "gpus_per_worker": 2, "cpu_per_worker": "8"}
    runtime, job = trainjob(**sized)
    meta, trainer = job["metadata"], job["spec"]["trainer"]
    assert meta["name"] == job_name("nightly", "0b5e-run-42") and meta["namespace"] == "team-a"
    assert meta["labels"]["pipeline/runid"] == "0b5e-run-42"
    assert job["spec"]["runtimeRef"] == {
        "name": runtime["metadata"]["name"],
        "apiGroup": "trainer.kubeflow.org",
        "kind": "TrainingRuntime",
    }
    assert (trainer["numNodes"], trainer["numProcPerNode"]) == (4, 2)
    assert trainer["command"] == container(mpijob(**sized), "Launcher")["command"]
    assert trainer["env"] == container(mpijob(**sized), "Launcher")["env"]
    amounts = {"cpu": "8", "memory": defaults.WORKER_MEMORY, "nvidia.com/gpu": 2}
    assert trainer["resourcesPerNode"] == {"requests": amounts, "limits": amounts}
    assert job["spec"]["activeDeadlineSeconds"] == defaults.JOB_ACTIVE_DEADLINE_SECONDS
    for j in runtime["spec"]["template"]["spec"]["replicatedJobs"]:  # node 0 is the launcher
        assert (
            j["template"]["spec"]["template"]["spec"]["tolerations"][0]["key"] == "nvidia.com/gpu"
        )


def test_runs_with_the_same_settings_share_one_runtime_and_other_settings_get_their_own() -> None:
    nightly = trainjob()[0]
    assert nightly == trainjob(run_name="weekly", pipeline_run_id="r-9", workers=5)[0]
    digest = spec_digest(nightly["spec"])  # run, size and resources are the TrainJob's
    assert nightly["metadata"]["name"] == f"kfp-horovod-{digest[:10]}"
    assert nightly["metadata"]["annotations"][SPEC_ANNOTATION] == digest
    names = {
        trainjob(**change)[0]["metadata"]["name"]
        for change in (
            {},
            {"trainer_image": "r/other:1"},
            {"trainer_service_account": "sa"},
            {"gpus_per_worker": 1},
            {"backoff_limit": 2},
            {"node_selector": {"pool": "a"}},
        )
    }
    assert len(names) == 6


def test_what_a_trainjob_cannot_do_is_refused_all_at_once_by_name() -> None:
    with pytest.raises(ValueError) as info:
        trainjob(workers=3, min_workers=2, queue="q", min_available=2, launcher_cpu="1")
    text = str(info.value)
    assert "min_workers=2: elastic training needs mpi-operator's discover_hosts.sh" in text
    assert "queue is an MPIJob scheduling policy" in text
    assert "min_available is an MPIJob scheduling policy" in text
    assert "launcher_cpu does not apply to a TrainJob: its launcher is node 0" in text


@pytest.mark.parametrize(
    ("name", "index", "change", "message"),
    [
        (
            "mpijob",
            0,
            lambda m: m["spec"].update(slotPerWorker=m["spec"].pop("slotsPerWorker")),
            r"spec: .*'slotPerWorker' was unexpected",
        ),
        (
            "mpijob",
            0,
            lambda m: m["spec"]["mpiReplicaSpecs"]["Worker"].update(replicas="two"),
            r"spec\.mpiReplicaSpecs\.Worker\.replicas: 'two'",
        ),
        (
            "mpijob",
            0,
            lambda m: m["spec"].update(mpiImplementation="LAM"),
            r"spec\.mpiImplementation",
        ),
        (
            "mpijob",
            0,
            lambda m: m["spec"].update(launcherCreationPolicy="Eventually"),
            r"spec\.launcherCreationPolicy: must be AtStartup or WaitForWorkersReady",
        ),
        (
            "mpijob",
            0,
            lambda m: m["spec"].pop("mpiReplicaSpecs"),
            r"'mpiReplicaSpecs' is a required property",
        ),
        (
            "mpijob",
            0,
            lambda m: container(m, "Launcher").update(imagePullPolice="Always"),
            r"containers\.0: .*'imagePullPolice'",
        ),
        ("mpijob", 0, lambda m: m.update(kind="TFJob"), r"kind: expected MPIJob"),
        (
            "trainjob",
            1,
            lambda m: m["spec"]["trainer"].update(numNode=m["spec"]["trainer"].pop("numNodes")),
            r"TrainJob .*spec\.trainer: .*'numNode' was unexpected",
        ),
        (
            "trainjob",
            0,
            lambda m: m["spec"]["mlPolicy"]["mpi"].update(mpiImplementation="LAM"),
            r"TrainingRuntime .*spec\.mlPolicy\.mpi\.mpiImplementation",
        ),
        (
            "trainjob",
            1,
            lambda m: m["spec"]["trainer"]["env"].append(
                {"name": "OMPI_MCA_plm_rsh_args", "value": "-v"}
            ),
            "OMPI_MCA_plm_rsh_args is reserved by Kubeflow Trainer",
        ),
    ],
)
def test_the_crds_refuse_typos_wrong_types_and_what_the_operators_refuse(
    name: str, index: int, change: Any, message: str
) -> None:
    b = job_kind(name)
    manifests = b.build(params(), "team-a")
    check_manifests(b, manifests)  # the good ones pass
    bad = copy.deepcopy(manifests)
    change(bad[index])
    with pytest.raises(ManifestError, match=message):
        check_manifests(b, bad)
