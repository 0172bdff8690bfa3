"""The train component's program: backend choice, the MPIJob wiring, and the report."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from components.common import storage
from components.common.failure import InputError
from components.train.config import TrainConfig
from components.train.launcher.parameters import TrainStep
from components.train.step import program as step_program
from components.train.step.program import FORCED, run_train_task
from components.train.summary import RunSummary, coordination_report, parse
from standins.kmock_cluster import Cluster


def _config(**overrides: Any) -> TrainConfig:
    base: dict[str, Any] = dict(
        data="gs://b/data",
        output="gs://b/run/train/train-work",
        model_dir="gs://b/run/train/model",
        workers=3,
        epochs=2,
        batch_size_per_worker=32,
        learning_rate=0.001,
        warmup_epochs=1,
    )
    return TrainConfig(**{**base, **overrides})


def _summary(world_size: int = 3, same: bool = True) -> RunSummary:
    return RunSummary(
        config=_config(augment=True),
        world_size=world_size,
        hosts=["w-0", "w-1"],
        controller="mpi",
        gradient_allreduce="host",
        resumed_from_epoch=0,
        adam={"learning_rate": 0.001 * world_size},
        dataset={},
        coverage={"samples": 900, "seen_per_epoch": 900, "disjoint": True, "covers_all": True},
        per_rank=[
            {
                "rank": r,
                "host": f"w-{r % 2}",
                "device": "CPU",
                "threads": 1,
                "sample_range": [300 * r, 300 * (r + 1)],
                "samples_per_epoch": 300,
                "steps_per_epoch": 10,
                "examples_per_second": 100.0,
                "weights_sha256": "ab" * 32 if same or r == 0 else "cd" * 32,
            }
            for r in range(world_size)
        ],
        final_metrics={"accuracy": 0.9, "loss": 0.3},
        saved_model_sha256="ef" * 32,
        model_parameters=1199882,
        weights_identical_across_ranks=same,
    )


def test_unknown_backend_is_refused_by_name() -> None:
    with pytest.raises(
        ValueError, match="training_backend must be one of auto, local, mpijob, trainjob, got 'k8s'"
    ):
        TrainStep(training_backend="k8s")


def _run_mpijob_task(tmp_path: Path, config: TrainConfig, **kw: Any) -> RunSummary:
    """The train task of `config` on the MPIJob backend, in namespace team-a."""
    step = TrainStep(trainer_image="reg/trainer:9", namespace="team-a", training_backend="mpijob")
    return run_train_task(
        config,
        step,
        outputs=(str(tmp_path / "summary"), str(tmp_path / "report")),
        **{"dataset_path": "/gcs/b/data", "model_path": "/gcs/b/run/train/model", **kw},
    )


def test_mpijob_backend_refuses_local_artifacts(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="data must be a gs:// URI .*root must be a gs:// bucket"):
        config = _config(data=str(tmp_path / "d"), model_dir="gs://b/m")
        _run_mpijob_task(tmp_path, config, dataset_path=str(tmp_path / "d"), model_path="/gcs/b/m")


@pytest.fixture
def gcs_dataset(gcs_uri: str) -> str:
    """A small real dataset at gs://<bucket>/data (fake-gcs-server): what the step checks
    before it launches a job."""
    from components.data_prep.prep import prepare

    prepare("bundled", f"{gcs_uri}/data", data_limit=300)
    return f"{gcs_uri}/data"


@pytest.fixture
def task_pod(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Cluster]:
    """A cluster (kmock's API) the step reaches through its kubeconfig, as outside a pod, and the
    task's own pod in it: the step runs as that pod (HOSTNAME) and its service account's
    namespace file names the namespace."""
    from kubernetes.config import kube_config

    from components.train.tests.cluster_jobs import write_kubeconfig
    from standins.kmock_cluster import NS, Cluster, pod

    with Cluster() as cluster:
        kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", cluster)
        monkeypatch.setattr(kube_config, "KUBE_CONFIG_DEFAULT_LOCATION", str(kubeconfig))
        monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
        cluster.core.create_namespaced_pod(NS, pod("task-pod", {}, uid="uid-of-the-task-pod"))
        monkeypatch.setenv("HOSTNAME", "task-pod")
        (tmp_path / "namespace").write_text(f"{NS}\n")
        monkeypatch.setattr(step_program, "SERVICE_ACCOUNT_NAMESPACE", str(tmp_path / "namespace"))
        yield cluster


@pytest.mark.timeout(60)  # a job made elsewhere would be waited for
def test_the_step_runs_its_artifacts_job_in_its_own_namespace_and_describes_the_model(
    task_pod: Cluster, gcs_dataset: str, tmp_path: Path
) -> None:
    """`train_step` on KFP's artifact classes and the step's declared parameters, the MPIJob
    backend, the real kubernetes client and `run_job` on kmock (its operator stood in: it
    writes a placeholder of rank 0's outputs where the job's command says, and trains
    nothing). What the step decides is read from the job it created: the namespace from its
    service account, its own pod as the owner, the ranks told the artifacts' URIs (not the
    step pod's /gcs paths) and the pipeline's workers; and the Model's metadata, which the
    evaluate and register steps read: the digest of the model at the artifact, the TensorBoard
    the ranks were told to write."""
    from kfp import dsl

    from components.common.model_files import DIGEST_KEY
    from components.train.config import from_argv
    from components.train.tests.cluster_jobs import complete, pod_specs
    from standins.kmock_cluster import MPIJOB_KIND, Operator, local_equivalent

    op = Operator(task_pod, MPIJOB_KIND)

    def script(op: Operator) -> None:
        name = op.wait_for_job()
        complete(op, name, op.start(name))

    op.play(script)
    bucket = gcs_dataset.rsplit("/", 1)[0]
    dataset = dsl.Dataset(uri=gcs_dataset)
    model = dsl.Model(uri=f"{bucket}/pipeline/run-42/train/model")
    run_summary = dsl.Artifact(uri=str(tmp_path / "run_summary"))
    report = dsl.Markdown(uri=str(tmp_path / "report"))
    trainer = {p.name: p.default for p in TrainConfig.parameters(pipeline_only=True)}
    step = {p.name: p.default for p in TrainStep.parameters(pipeline_only=True)}
    trainer.update(workers=3, slots_per_worker=2)
    step.update(trainer_image="reg/trainer:9", training_backend="mpijob", namespace="")
    step_program.train_step(dataset, model, run_summary, report, "run-42", **trainer, **step)
    op.join()

    (name,) = task_pod.job_names()  # in the namespace the service account's file names
    job = op.job(name)
    (owner,) = job["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"], owner["uid"]) == (
        "Pod",
        "task-pod",
        "uid-of-the-task-pod",
    )
    command, _ = MPIJOB_KIND.launcher(job)
    ranks, args, _ = local_equivalent(command)
    told = from_argv(args)
    assert (told.data, told.model_uri) == (dataset.uri, model.uri)
    assert (ranks, told.workers, told.slots_per_worker) == (6, 3, 2)
    # its work (summary, checkpoints, TensorBoard) beside the Model artifact, not inside it
    assert told.output.rsplit("/", 1)[0] == model.uri.rsplit("/", 1)[0] != told.output
    assert {c["image"] for spec in pod_specs(job) for c in spec["containers"]} == {"reg/trainer:9"}
    at_artifact = storage.read_bytes(storage.join(model.uri, "saved_model.pb"))
    assert model.metadata[DIGEST_KEY] == hashlib.sha256(at_artifact).hexdigest()
    assert model.metadata["tensorboard_uri"] == told.tensorboard_uri
    assert json.loads(json.dumps([model.metadata, run_summary.metadata]))  # KFP stores JSON
    record = parse(Path(run_summary.path).read_text())
    assert (record.training_backend, record.training_backend_reason) == ("mpijob", FORCED)
    assert f"- Backend: **mpijob** ({FORCED})" in Path(report.path).read_text()


def test_without_a_namespace_the_step_refuses_before_asking_the_cluster(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No namespace parameter and no service account file (outside a pod): one line naming
    what to pass, before any request (no kubeconfig here: a request would fail otherwise)."""
    monkeypatch.setattr(step_program, "SERVICE_ACCOUNT_NAMESPACE", str(tmp_path / "none"))
    step = TrainStep(trainer_image="reg/trainer:9", training_backend="trainjob", namespace="")
    with pytest.raises(InputError) as info:
        run_train_task(_config(), step, "", "", (str(tmp_path / "s"), str(tmp_path / "r")))
    assert str(info.value) == (
        "namespace is empty and this pod's namespace is unknown: pass namespace"
    )
    assert not (tmp_path / "s").exists()


def test_report_answers_one_model_or_n_and_flags_diverged_ranks() -> None:
    text = coordination_report(_summary())
    assert "**3 workers formed ONE Horovod job and trained ONE model**" in text
    differ = coordination_report(_summary(same=False))
    assert "**3 workers formed ONE Horovod job but their final weights differ: not one model**" in (
        differ
    )
    assert "WARNING: ranks ended with 2 different weight fingerprints" in differ
    assert "formed by the mpi controller" in text
    assert "Global batch: **96** = 3 workers x 32 per worker" in text
    assert "Learning rate: **0.003** = 0.001 x 3 workers" in text
    assert text.count("| CPU | 1 |") == 3  # one row per rank
    assert "| 2 | w-0 | CPU | 1 | [600, 900) | 300 | 10 | 100.0 |" in text
    assert "identical on all 3 ranks" in text
    assert "**1 model, exported by rank 0, at `gs://b/run/train/model`**" in text
    assert "- Model: **mnist_advanced** (1,199,882 parameters), augmentation on" in text


BAD_ENTRY_POINT = "components.train.tests.user_model:five_classes"


def test_both_launchers_check_the_job_before_starting_a_rank(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, gcs_dataset: str
) -> None:
    """A model that does not fit the dataset's classes, and a dataset too small for the job's
    ranks, stop the local launcher and the cluster step before any rank or job starts."""
    from components.train.launcher import launch
    from components.train.launcher.cluster import run
    from components.train.launcher.preflight import PreflightError

    def must_not_start(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("no mpirun and no cluster job may start")

    monkeypatch.setattr(launch, "local_command", must_not_start)
    monkeypatch.setattr(run, "run_job", must_not_start)
    local = str(tmp_path / "data")
    storage.download_dir(gcs_dataset, local)
    config = TrainConfig(data=local, output=str(tmp_path), workers=3, model=BAD_ENTRY_POINT)
    with pytest.raises(PreflightError) as info:
        launch.run_local(config)
    assert str(info.value) == (
        f"kfp-horovod preflight failed: model '{BAD_ENTRY_POINT}' returns outputs of shape "
        "(None, 5); the trainer needs (None, 10): one probability per class. No rank was started."
    )
    with pytest.raises(PreflightError, match="returns outputs of shape"):
        _run_mpijob_task(tmp_path, _config(model=BAD_ENTRY_POINT, data=gcs_dataset))
    too_many = _config(data=gcs_dataset, workers=400, batch_size_per_worker=1)
    with pytest.raises(PreflightError) as info:
        _run_mpijob_task(tmp_path, too_many)
    assert f"{gcs_dataset}: the train split has 300 samples, fewer than the job's 400 ranks" in (
        str(info.value)
    )


def test_work_dir_sits_beside_the_model_artifact() -> None:
    assert step_program.work_uri("gs://b/p/run/train/model") == "gs://b/p/run/train/train-work"
    assert step_program.work_uri("/x/train/model/") == "/x/train/train-work"


def test_report_shows_an_elastic_jobs_world_sizes_and_each_epochs_coverage() -> None:
    summary = _summary()
    summary.elastic = {
        "min_workers": 2,
        "max_workers": 3,
        "world_size_history": [
            {"epoch": 0, "world_size": 3, "when": "2026-12-03T06:00:00Z", "why": "start"},
            {
                "epoch": 2,
                "world_size": 2,
                "when": "2026-12-03T06:01:00Z",
                "why": "a worker was lost (a collective failed)",
            },
        ],
        "epochs": [
            {
                "epoch": e,
                "world_size": 3 if e <= 2 else 2,
                "seen_per_epoch": 900,
                "disjoint": True,
                "covers_all": True,
            }
            for e in (1, 2, 3)
        ],
    }
    text = coordination_report(summary)
    assert (
        "elastic job (2 to 3 workers): 3 workers from epoch 1; then 2 workers from epoch 3 "
        "(a worker was lost (a collective failed), 2026-12-03T06:01:00Z)"
    ) in text
    assert "| 2 | 3 | 900 | True | True |" in text and "| 3 | 2 | 900 | True | True |" in text
    assert "## Elastic training" not in coordination_report(_summary())  # static: no section
