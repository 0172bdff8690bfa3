"""The training MPIJob executed the way mpi-operator v2beta1 executes it: real trainer image,
real Open MPI, real sshd and ssh, real Horovod, data and model on gs:// (the emulator).

The operator and the kubelet are played by `mpijob_harness` (see its docstring); everything
the containers run comes from the manifest that `build_manifest` makes, the same builder as
``render-mpijob`` and the train component.
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
from components.train.cluster.mpijob import build_manifest
from components.train.cluster.pods import trainer_command
from components.train.mpiwatch import EXIT_SILENT_RANK
from standins.mpijob_harness import LauncherResult, MPIJobRun
from standins.outputs import half_written
from tests.containers.support import (
    NAMESPACE,
    STALL_SECONDS,
    assert_epochs_once_and_no_line_per_rank,
    bucket_of,
    model_files,
    params,
    require_images,
    tagged_lines,
    wait_for_checkpoint,
)

pytestmark = pytest.mark.containers


def run_job(p: ClusterJobParams, docker: Any, gcs: tuple[Any, str], tmp: Path) -> dict[str, Any]:
    """Run the MPIJob of `p` to its end; returns the result, the summary and the harness."""
    with MPIJobRun(build_manifest(p, NAMESPACE), docker, tmp, emulator=gcs[0]) as job:
        job.start_workers()
        result = job.run_launcher(timeout=600)
        limits = job.limits(job.worker_template)
    summary_text = (
        storage.read_text(p.train.summary_uri) if storage.exists(p.train.summary_uri) else "{}"
    )
    print(f"{p.run_name}: launcher exit {result.exit_code} after {result.seconds:.1f} s")
    return {"result": result, "summary": json.loads(summary_text), "cpus": limits[0], "p": p}


# --- a. the seed's case: 3 workers x 1 slot -------------------------------------------------


@pytest.fixture(scope="module")
def job_3x1(
    trainer_image: str, data_uri: str, docker_client: Any, gcs_container: Any, tmp_path_factory: Any
) -> dict[str, Any]:
    p = params(trainer_image, data_uri, "seed-3x1", workers=3, slots_per_worker=1)
    return run_job(p, docker_client, gcs_container, tmp_path_factory.mktemp("job-3x1"))


def test_3x1_launcher_succeeds_as_one_mpi_job_of_3(job_3x1: dict[str, Any]) -> None:
    result: LauncherResult = job_3x1["result"]
    assert result.exit_code == 0, result.log[-4000:]
    summary = job_3x1["summary"]
    assert summary["world_size"] == summary["config"]["workers"] == 3
    assert summary["controller"] == "mpi"
    assert len(summary["hosts"]) == 3 and all("-worker-" in h for h in summary["hosts"])


def test_3x1_exports_exactly_one_model_with_identical_weights(job_3x1: dict[str, Any]) -> None:
    p: ClusterJobParams = job_3x1["p"]
    assert model_files(bucket_of(p.train.output)) == [f"{p.train.model_uri}/saved_model.pb"]
    summary = job_3x1["summary"]
    assert summary["weights_identical_across_ranks"] is True
    assert len({r["weights_sha256"] for r in summary["per_rank"]}) == 1
    assert summary["coverage"]["disjoint"] and summary["coverage"]["covers_all"]


def test_3x1_logs_every_epoch_once_and_no_line_once_per_rank(job_3x1: dict[str, Any]) -> None:
    assert_epochs_once_and_no_line_per_rank(job_3x1["result"].log, job_3x1["p"].train.epochs)


def test_3x1_threads_follow_the_worker_cpu_limit(job_3x1: dict[str, Any]) -> None:
    """Each worker container's --cpus is the manifest's limit scaled to this machine; every
    rank's thread count follows it, not the cores it can see."""
    expected = max(1, int(job_3x1["cpus"]) // job_3x1["p"].train.slots_per_worker)
    assert [r["threads"] for r in job_3x1["summary"]["per_rank"]] == [expected] * 3


# --- b. 2 workers x 2 slots -----------------------------------------------------------------


def test_2x2_forms_one_job_of_4_and_one_model(
    trainer_image: str, data_uri: str, docker_client: Any, gcs_container: Any, tmp_path: Path
) -> None:
    p = params(trainer_image, data_uri, "two-by-two", workers=2, slots_per_worker=2)
    job = run_job(p, docker_client, gcs_container, tmp_path)
    assert job["result"].exit_code == 0, job["result"].log[-4000:]
    summary = job["summary"]
    assert (summary["world_size"], summary["controller"]) == (4, "mpi")
    assert sorted(r["local_rank"] for r in summary["per_rank"]) == [0, 0, 1, 1]
    assert len(summary["hosts"]) == 2
    assert model_files(bucket_of(p.train.output)) == [f"{p.train.model_uri}/saved_model.pb"]


# --- c. the seed's failure: every worker runs the trainer itself ----------------------------


def test_workers_running_the_trainer_themselves_stop_as_independent_copies(
    trainer_image: str, data_uri: str, docker_client: Any, gcs_container: Any, tmp_path: Path
) -> None:
    """The seed's mistake, reproduced: an MPIJob whose workers run the script (no mpirun).
    Every copy is a world of 1; the preflight stops each one and nothing is exported."""
    p = params(trainer_image, data_uri, "independent", workers=3)
    manifest = build_manifest(p, NAMESPACE)
    worker = manifest["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]
    worker["command"], worker["args"] = trainer_command(p), []
    with MPIJobRun(manifest, docker_client, tmp_path, emulator=gcs_container[0]) as job:
        job.start_workers()
        codes = [w.wait(timeout=300)["StatusCode"] for w in job.workers]
        logs = job.worker_logs()
    assert codes == [3, 3, 3], logs
    for log in logs.values():
        assert "independent copies, not one job" in log, log
    assert storage.list_files(p.train.output) == []


# --- d. a worker container killed mid-run ---------------------------------------------------


def test_elastic_job_loses_a_worker_and_finishes_on_two(
    trainer_image: str, data_uri: str, docker_client: Any, gcs_container: Any, tmp_path: Path
) -> None:
    """An elastic MPIJob (min_workers 2 of 3): worker 1's pod is killed mid-run, the operator
    stops listing it, and the launcher's elastic horovodrun finishes the job on the other two."""
    p = params(trainer_image, data_uri, "elastic", workers=3, min_workers=2, epochs=6)
    manifest = build_manifest(p, NAMESPACE)
    with MPIJobRun(manifest, docker_client, tmp_path, emulator=gcs_container[0]) as job:
        job.start_workers()
        job.wait_ready()
        job.start_launcher()
        killed_after = wait_for_checkpoint(p.train.checkpoint_uri, job)
        job.kill_worker(1)
        job.update_discovery()
        result = job.wait_launcher(timeout=600)
    print(f"elastic: worker 1 killed after epoch {killed_after}; launcher exit {result.exit_code}")
    assert result.exit_code == 0, result.log[-5000:]
    assert model_files(bucket_of(p.train.output)) == [f"{p.train.model_uri}/saved_model.pb"]
    summary = json.loads(storage.read_text(p.train.summary_uri))
    history = summary["elastic"]["world_size_history"]
    print("history:", history)
    assert [h["world_size"] for h in history] == [3, 2], history
    assert summary["world_size"] == 2 and summary["weights_identical_across_ranks"] is True
    assert job.worker_name(1) not in {r["host"] for r in summary["per_rank"]}
    epochs = summary["elastic"]["epochs"]
    assert [e["epoch"] for e in epochs] == list(range(1, 7))
    assert all(e["disjoint"] and e["covers_all"] for e in epochs), epochs


def test_killed_worker_fails_the_job_fast_and_a_rerun_resumes(
    trainer_image: str, data_uri: str, docker_client: Any, gcs_container: Any, tmp_path: Path
) -> None:
    p = params(trainer_image, data_uri, "killed", workers=3, epochs=30)  # ends well before epoch 30
    checkpoint_uri = p.train.checkpoint_uri
    with MPIJobRun(build_manifest(p, NAMESPACE), docker_client, tmp_path / "1", emulator=gcs_container[0]) as job:  # fmt: skip  # noqa: E501
        job.start_workers()
        job.wait_ready()
        job.start_launcher()
        seen = wait_for_checkpoint(checkpoint_uri, job)
        killed_at = time.monotonic()
        job.kill_worker(1)
        result = job.wait_launcher(timeout=STALL_SECONDS + 120)
        detected_after = time.monotonic() - killed_at
    lost = [line for line in result.log.splitlines() if job.worker_name(1) in line]
    print(f"killed worker 1; launcher exit {result.exit_code} {detected_after:.1f} s later:")
    print("\n".join(lost[:6]))
    assert result.exit_code != 0
    assert detected_after < STALL_SECONDS, f"the job took {detected_after:.0f} s to fail"
    assert job.worker_name(1) in result.log, result.log[-3000:]
    # No model, and nothing half-written where the model goes.
    assert storage.list_files(p.train.model_uri) == []
    resume_from = checkpoints.latest(checkpoint_uri)
    assert resume_from is not None and seen <= resume_from.epoch < p.train.epochs, resume_from

    rerun = run_job(p, docker_client, gcs_container, tmp_path / "2")
    assert rerun["result"].exit_code == 0, rerun["result"].log[-4000:]
    assert f"resuming from checkpoint after epoch {resume_from.epoch} of" in rerun["result"].log
    assert rerun["summary"]["resumed_from_epoch"] == resume_from.epoch
    assert model_files(bucket_of(p.train.output)) == [f"{p.train.model_uri}/saved_model.pb"]


# --- e. a worker's rank frozen mid-run ------------------------------------------------------

FROZEN_BOUND = 20  # stall_shutdown_seconds of this job: the launcher's watch bound


def test_frozen_rank_is_named_and_ends_the_job_within_the_bound_and_a_rerun_resumes(
    trainer_image: str, data_uri: str, docker_client: Any, gcs_container: Any, tmp_path: Path
) -> None:
    """Worker 1's trainer is stopped (SIGSTOP) once a checkpoint exists: the other ranks wait
    in a collective that cannot finish, and Horovod's stall check cannot fire. The launcher's
    heartbeat watch names rank 1 and worker 1's pod and ends the job; nothing is exported or
    left half-written, and a rerun resumes from the last checkpoint."""
    # 30 epochs: the freeze lands well before the last one, however slow
    # the poll for the first checkpoint is on a busy machine.
    p = params(trainer_image, data_uri, "frozen", FROZEN_BOUND, workers=3, epochs=30)
    checkpoint_uri = p.train.checkpoint_uri
    with MPIJobRun(build_manifest(p, NAMESPACE), docker_client, tmp_path / "1", emulator=gcs_container[0]) as job:  # fmt: skip  # noqa: E501
        job.start_workers()
        job.wait_ready()
        job.start_launcher()
        seen = wait_for_checkpoint(checkpoint_uri, job)
        user = job.worker_template.user
        stop = job.workers[1].exec_run(["pkill", "-STOP", "-f", "components.train"], user=user)
        stopped_at = time.monotonic()
        assert stop.exit_code == 0, stop.output.decode()
        result = job.wait_launcher(timeout=FROZEN_BOUND + 300)
        failed_after = time.monotonic() - stopped_at
        host = job.worker_name(1)
    named = [line for line in result.log.splitlines() if line.startswith("mpiwatch: ")]
    print(f"frozen worker 1: launcher exit {result.exit_code} {failed_after:.1f} s after SIGSTOP")
    print("\n".join(named))
    assert result.exit_code == EXIT_SILENT_RANK, result.log[-5000:]
    assert any(f"rank 1 on {host} sent no heartbeat for" in line for line in named), named
    assert named[-1].startswith(f"mpiwatch: the job failed: rank 1 on {host} "), named
    assert "kfp-horovod-heartbeat" not in result.log  # the watch takes the beats out
    assert storage.list_files(p.train.model_uri) == []
    resume_from = checkpoints.latest(checkpoint_uri)
    assert resume_from is not None and seen <= resume_from.epoch < p.train.epochs, resume_from
    # The job ends rank 0 wherever it is, so a checkpoint upload may stop midway: those files sit
    # in the next epoch's folder, which has no marker, so the resume above passed it over.
    partial = half_written(bucket_of(p.train.output))
    in_flight = f"frozen/checkpoints/{checkpoints.epoch_dir(resume_from.epoch + 1)}/"
    assert all(f.startswith(in_flight) for f in partial), partial

    rerun = run_job(p, docker_client, gcs_container, tmp_path / "2")
    assert rerun["result"].exit_code == 0, rerun["result"].log[-4000:]
    assert f"resuming from checkpoint after epoch {resume_from.epoch} of" in rerun["result"].log
    assert rerun["summary"]["resumed_from_epoch"] == resume_from.epoch
    assert model_files(bucket_of(p.train.output)) == [f"{p.train.model_uri}/saved_model.pb"]
    assert half_written(bucket_of(p.train.output)) == []  # the rerun rewrote that epoch whole


# --- a job that asks for GPUs, on this machine without any --------------------------------


@pytest.mark.parametrize("variant", ["trainer_gpu", "trainer"])
def test_a_gpu_job_stops_every_rank_before_training_naming_why(
    variant: str, data_uri: str, docker_client: Any, gcs_container: Any, tmp_path: Path
) -> None:
    """2 workers x 1 GPU each. In the GPU image (what gpus_per_worker > 0 picks) every library
    loads, but the containers have no GPU: "sees no GPU". In the CPU image (a user-given
    trainer_image): "a CPU image". Either way every rank stops before its first step, with one
    line from rank 0, nothing written, and the launcher fails: never a silent CPU run."""
    image = require_images(docker_client, variant)[variant]
    p = params(image, data_uri, f"gpu-{variant.replace('_', '-')}", gpus_per_worker=1)
    job = run_job(p, docker_client, gcs_container, tmp_path)
    result: LauncherResult = job["result"]
    assert result.exit_code != 0, result.log[-3000:]
    failed = [t for r, t in tagged_lines(result.log) if r == 0 and "training failed: " in t]
    why = {
        "trainer_gpu": "2 of 2 ranks cannot train: this job asked for 1 GPU(s) per worker, but "
        "this rank sees no GPU (TensorFlow found none",
        "trainer": "2 of 2 ranks cannot train: this job asked for 1 GPU(s) per worker, but the "
        "trainer runs in a CPU image: TensorFlow cannot load libcudart.so.12",
    }[variant]
    assert len(failed) == 1 and why in failed[0], result.log[-3000:]
    assert not [t for _, t in tagged_lines(result.log) if "Epoch 1/" in t], "no rank may train"
    assert not [t for _, t in tagged_lines(result.log) if t.startswith("Traceback")]
    assert model_files(bucket_of(p.train.output)) == []
    assert not storage.exists(p.train.summary_uri)
