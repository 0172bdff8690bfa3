"""The training job of each cluster backend executed the way its operator executes it: real
trainer image, real Open MPI, real sshd and ssh, real Horovod, data and model on gs:// (the
emulator). The operators and the kubelet are played by `standins.mpijob_harness` (mpi-operator)
and `standins.trainjob_harness` (Kubeflow Trainer and JobSet, the launcher running as node 0);
everything the containers run comes from the manifests the project's builders make.

The cases both backends share are parametrized over them; the MPIJob's own (elastic, a frozen
rank, the seed's mistake, a GPU job here) follow.
"""

from __future__ import annotations

import json
import re
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from components.common import storage
from components.common.failure import ExitCode
from components.train.config import TrainConfig
from components.train.launcher.cluster.job import ClusterJobParams
from components.train.launcher.cluster.mpijob import build_manifest
from components.train.launcher.cluster.pods import trainer_command
from components.train.launcher.cluster.trainjob import build_manifests
from components.train.launcher.parameters import TrainStep
from components.train.rank import checkpoints
from standins.mpijob_harness import MPIJobRun
from standins.outputs import half_written
from standins.pods import DockerJob
from standins.trainjob_harness import TrainJobRun
from tests.containers.conftest import USER_MODEL_MODULE
from tests.containers.support import new_bucket, require_images

pytestmark = pytest.mark.containers
NAMESPACE, STALL_SECONDS = "kfp", 60  # the cluster jobs' default stall bound here
BACKENDS = ["mpijob", "trainjob"]
_TAGGED = re.compile(r"^\[1,(\d+)\]<(stdout|stderr)>:(.*)$")


def params(image: str, data: str, run: str, stall: int = STALL_SECONDS, **train: Any) -> ClusterJobParams:  # fmt: skip  # noqa: E501
    """A run of 2 epochs, batch 32, of the small model, with a stall bound of `stall` seconds;
    `train` sets TrainConfig fields (workers, epochs, ...)."""
    config = TrainConfig(
        **{"data": data, "output": f"gs://{new_bucket()}/{run}", "workers": 2, "epochs": 2,
           "batch_size_per_worker": 32, "model": "small", **train}
    )  # fmt: skip
    step = TrainStep(
        trainer_image=image, cpu_per_worker="1", memory_per_worker="2Gi",
        stall_shutdown_seconds=stall,
    )  # fmt: skip
    return ClusterJobParams(run_name=run, train=config, step=step)


def harness(backend: str, p: ClusterJobParams, docker: Any, gcs: Any, tmp: Path) -> DockerJob:
    """The job of `p` on `backend`, as its operator runs it (not started)."""
    if backend == "mpijob":
        return MPIJobRun(build_manifest(p, NAMESPACE), docker, tmp, emulator=gcs[0])
    return TrainJobRun(*build_manifests(p, NAMESPACE), docker, tmp, emulator=gcs[0])


def run_job(backend: str, p: ClusterJobParams, docker: Any, gcs: Any, tmp: Path) -> dict[str, Any]:
    """Run the job of `p` to its end: its result, summary, pods in the hostfile, worker CPUs."""
    with harness(backend, p, docker, gcs, tmp) as job:
        job.start_workers()
        result = job.run_launcher(timeout=600)
    uri = p.train.summary_uri
    summary = json.loads(storage.read_text(uri)) if storage.exists(uri) else {}
    print(f"{p.run_name}: launcher exit {result.exit_code} after {result.seconds:.1f} s")
    return {"result": result, "summary": summary, "p": p, "nodes": job.hostfile_pods(),
            "cpus": job.limits(job.worker_template)[0]}  # fmt: skip


def tagged_lines(log: str) -> list[tuple[int, str]]:
    """``(rank, text)`` of every line mpirun tagged with its rank (``--tag-output``)."""
    return [(int(m[1]), m[3]) for m in map(_TAGGED.match, log.splitlines()) if m]


def one_model(p: ClusterJobParams) -> bool:
    """Exactly one SavedModel in the run's bucket, where the run puts it."""
    files = storage.list_files(bucket_of(p.train.output))
    return [f for f in files if f.endswith("/saved_model.pb")] == [
        f"{p.train.model_uri}/saved_model.pb"
    ]


def bucket_of(uri: str) -> str:
    return "/".join(uri.split("/")[:3])


def wait_for_checkpoint(uri: str, job: DockerJob, timeout: float = 300) -> int:
    """The epoch of the first checkpoint committed under `uri`, while `job`'s launcher runs (the
    state file alone: reading the checkpoint itself would race the rotation of the running job)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        epoch = checkpoints.committed(uri)
        if epoch > 0:
            return epoch
        job.launcher.reload()
        assert job.launcher.status == "running", job.launcher.logs().decode()[-3000:]
        time.sleep(0.5)
    raise TimeoutError(f"no checkpoint under {uri} after {timeout:g} s")


def assert_rerun_resumes(backend: str, p: ClusterJobParams, seen: int, *run: Any) -> None:
    """No model and nothing half-written but the checkpoint in flight; a rerun of the same job
    resumes from the last checkpoint and exports the one model, leaving nothing partial."""
    assert storage.list_files(p.train.model_uri) == []
    resume_from = checkpoints.latest(p.train.checkpoint_uri)
    assert resume_from is not None and seen <= resume_from.epoch < p.train.epochs, resume_from
    # The job ends rank 0 wherever it is, so a checkpoint upload may stop midway: the next
    # epoch's data file without its index, which the state file does not name yet, so the resume
    # above passed it over.
    in_flight = f"{p.run_name}/checkpoints/{checkpoints.name(resume_from.epoch + 1)}."
    partial = half_written(bucket_of(p.train.output))
    assert all(f.startswith(in_flight) for f in partial), partial
    rerun = run_job(backend, p, *run)
    assert rerun["result"].exit_code == 0, rerun["result"].log[-4000:]
    assert f"resuming from checkpoint after epoch {resume_from.epoch} of" in rerun["result"].log
    assert rerun["summary"]["resumed_from_epoch"] == resume_from.epoch
    assert one_model(p) and half_written(bucket_of(p.train.output)) == []


# --- both backends: 3 workers x 1 slot, 2 x 2, a worker killed --------------------------------


@pytest.fixture(scope="module", params=BACKENDS)
def job_3x1(
    request: Any, user_model_image: str, data_uri: str, docker_client: Any, gcs_container: Any,
    tmp_path_factory: Any,
) -> dict[str, Any]:  # fmt: skip
    """A user's Keras 3 model (keras.ops, a custom layer) whose ranks draw different initial
    weights, in an image built FROM the trainer image, on 3 pods."""
    model = f"{USER_MODEL_MODULE}:per_rank_weights"
    p = params(user_model_image, data_uri, f"{request.param}-3x1", workers=3, slots_per_worker=1,
               model=model)  # fmt: skip
    tmp = tmp_path_factory.mktemp(p.run_name)
    return run_job(request.param, p, docker_client, gcs_container, tmp)


def test_3x1_forms_one_mpi_job_of_3_on_the_pods_in_the_hostfile(job_3x1: dict[str, Any]) -> None:
    assert job_3x1["result"].exit_code == 0, job_3x1["result"].log[-4000:]
    summary = job_3x1["summary"]
    assert summary["world_size"] == summary["config"]["workers"] == 3
    assert summary["controller"] == "mpi"
    assert sorted(summary["hosts"]) == sorted(job_3x1["nodes"])


def test_3x1_exports_exactly_one_model_with_identical_weights(job_3x1: dict[str, Any]) -> None:
    """The Keras 3 model's ranks started apart: rank 0's broadcast made them one model."""
    assert one_model(job_3x1["p"])
    summary = job_3x1["summary"]
    assert summary["start_weights_identical_across_ranks"] is True
    assert summary["metrics_averaged_across_ranks"] is True
    assert summary["weights_identical_across_ranks"] is True
    assert len({r["weights_sha256"] for r in summary["per_rank"]}) == 1
    assert summary["coverage"]["disjoint"] and summary["coverage"]["covers_all"]


def test_3x1_logs_every_epoch_once_and_no_line_once_per_rank(job_3x1: dict[str, Any]) -> None:
    lines, epochs = tagged_lines(job_3x1["result"].log), job_3x1["p"].train.epochs
    assert lines, "no rank-tagged output: was --tag-output dropped?"
    for epoch in range(1, epochs + 1):
        hits = [(r, t) for r, t in lines if f"Epoch {epoch}/{epochs} " in t]
        assert len(hits) == 1 and hits[0][0] == 0, hits
    ranks_by_text: dict[str, set[int]] = defaultdict(set)
    for rank, text in lines:
        ranks_by_text[text].add(rank)
    repeated = {t: sorted(r) for t, r in ranks_by_text.items() if len(r) > 1 and t.strip()}
    assert not repeated, f"lines printed once per rank: {repeated}"


def test_3x1_threads_follow_the_worker_cpu_limit(job_3x1: dict[str, Any]) -> None:
    """Each worker container's --cpus is the manifest's limit scaled to this machine; every
    rank's thread count follows it, not the cores it can see."""
    expected = max(1, int(job_3x1["cpus"]) // job_3x1["p"].train.slots_per_worker)
    assert [r["threads"] for r in job_3x1["summary"]["per_rank"]] == [expected] * 3


@pytest.mark.parametrize("backend", BACKENDS)
def test_2x2_forms_one_job_of_4_and_one_model(
    backend: str, trainer_image: str, data_uri: str, docker_client: Any, gcs_container: Any,
    tmp_path: Path,
) -> None:  # fmt: skip
    p = params(trainer_image, data_uri, f"{backend}-2x2", workers=2, slots_per_worker=2)
    job = run_job(backend, p, docker_client, gcs_container, tmp_path)
    assert job["result"].exit_code == 0, job["result"].log[-4000:]
    summary = job["summary"]
    assert (summary["world_size"], summary["controller"]) == (4, "mpi")
    assert sorted(r["local_rank"] for r in summary["per_rank"]) == [0, 0, 1, 1]
    assert sorted(summary["hosts"]) == sorted(job["nodes"]) and len(job["nodes"]) == 2
    assert one_model(p)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_killed_worker_fails_the_job_fast_and_a_rerun_resumes(
    backend: str, trainer_image: str, data_uri: str, docker_client: Any, gcs_container: Any,
    tmp_path: Path,
) -> None:  # fmt: skip
    """Worker 1's pod is SIGKILLed once a checkpoint exists (a node lost): the launcher fails
    within the stall bound, naming that pod; no model; a rerun resumes."""
    p = params(trainer_image, data_uri, f"{backend}-killed", workers=3, epochs=30)  # ends early
    with harness(backend, p, docker_client, gcs_container, tmp_path / "1") as job:
        job.start_workers()
        job.wait_ready()
        job.start_launcher()
        seen = wait_for_checkpoint(p.train.checkpoint_uri, job)
        killed_at = time.monotonic()
        job.kill_worker(1)
        result = job.wait_launcher(timeout=STALL_SECONDS + 120)
        detected_after = time.monotonic() - killed_at
    host = job.worker_name(1)
    print(f"killed {host}; launcher exit {result.exit_code} {detected_after:.1f} s later:")
    print("\n".join([line for line in result.log.splitlines() if host in line][:6]))
    assert result.exit_code != 0
    assert detected_after < STALL_SECONDS, f"the job took {detected_after:.0f} s to fail"
    assert host in result.log, result.log[-3000:]
    assert_rerun_resumes(backend, p, seen, docker_client, gcs_container, tmp_path / "2")


# --- the MPIJob's own cases -------------------------------------------------------------------


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


def test_elastic_job_loses_a_worker_and_finishes_on_two(
    trainer_image: str, data_uri: str, docker_client: Any, gcs_container: Any, tmp_path: Path
) -> None:
    """An elastic MPIJob (min_workers 2 of 3): worker 1's pod is killed mid-run, the operator
    stops listing it, and the launcher's elastic horovodrun finishes the job on the other two."""
    p = params(trainer_image, data_uri, "elastic", workers=3, min_workers=2, epochs=6)
    with MPIJobRun(build_manifest(p, NAMESPACE), docker_client, tmp_path,
                   emulator=gcs_container[0]) as job:  # fmt: skip
        job.start_workers()
        job.wait_ready()
        job.start_launcher()
        killed_after = wait_for_checkpoint(p.train.checkpoint_uri, job)
        job.kill_worker(1)
        job.update_discovery()
        result = job.wait_launcher(timeout=600)
    print(f"elastic: worker 1 killed after epoch {killed_after}; launcher exit {result.exit_code}")
    assert result.exit_code == 0, result.log[-5000:]
    assert one_model(p)
    summary = json.loads(storage.read_text(p.train.summary_uri))
    history = summary["elastic"]["world_size_history"]
    assert [h["world_size"] for h in history] == [3, 2], history
    assert summary["world_size"] == 2 and summary["weights_identical_across_ranks"] is True
    assert job.worker_name(1) not in {r["host"] for r in summary["per_rank"]}
    epochs = summary["elastic"]["epochs"]
    assert [e["epoch"] for e in epochs] == list(range(1, 7))
    assert all(e["disjoint"] and e["covers_all"] for e in epochs), epochs


FROZEN_BOUND = 20  # stall_shutdown_seconds of this job: the launcher's watch bound


def test_frozen_rank_is_named_and_ends_the_job_within_the_bound_and_a_rerun_resumes(
    trainer_image: str, data_uri: str, docker_client: Any, gcs_container: Any, tmp_path: Path
) -> None:
    """Worker 1's trainer is stopped (SIGSTOP) once a checkpoint exists: the other ranks wait
    in a collective that cannot finish, and Horovod's stall check cannot fire. The launcher's
    heartbeat watch names rank 1 and worker 1's pod and ends the job; nothing is exported or
    left half-written, and a rerun resumes from the last checkpoint."""
    # 30 epochs: the freeze lands well before the last one, however slow the poll is.
    p = params(trainer_image, data_uri, "frozen", FROZEN_BOUND, workers=3, epochs=30)
    with MPIJobRun(build_manifest(p, NAMESPACE), docker_client, tmp_path / "1",
                   emulator=gcs_container[0]) as job:  # fmt: skip
        job.start_workers()
        job.wait_ready()
        job.start_launcher()
        seen = wait_for_checkpoint(p.train.checkpoint_uri, job)
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
    assert result.exit_code == ExitCode.SILENT_RANK, result.log[-5000:]
    assert any(f"rank 1 on {host} sent no heartbeat for" in line for line in named), named
    assert named[-1].startswith(f"mpiwatch: the job failed: rank 1 on {host} "), named
    assert "kfp-horovod-heartbeat" not in result.log  # the watch takes the beats out
    assert_rerun_resumes("mpijob", p, seen, docker_client, gcs_container, tmp_path / "2")


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
    job = run_job("mpijob", p, docker_client, gcs_container, tmp_path)
    result = job["result"]
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
    assert not [f for f in storage.list_files(p.train.output) if f.endswith("/saved_model.pb")]
    assert not storage.exists(p.train.summary_uri)
