"""The compiled pipeline's train step, run with ``training_backend=trainjob`` (or ``auto``) as
KFP runs it, against a Kubernetes API with Kubeflow Trainer: create, log stream, completion,
retry, cancel, and the task config a pipeline author sets on the train task.

Real: the compiled pipeline, the train executor's own command and arguments from it run in a
subprocess (kfp's ``executor_main`` calling ``components.train.step.program.train_step``), the
``kubernetes`` client reaching kmock's API emulator through a kubeconfig, fake-gcs-server.
Stood in, said so: Trainer, JobSet, the kubelet and the garbage collector
(`standins.kmock_cluster`'s operators; the real trainer runs the job's own command where a test
asserts what training did, elsewhere a placeholder of rank 0's outputs); the ``/gcs/`` mount
KFP's launcher gives the task's pod (a ``sitecustomize`` points kfp's
``artifact_types._GCS_LOCAL_MOUNT_PREFIX`` at a temporary folder); and KFP's driver: the values
it resolves (the run's parameters, the check step's image, the artifacts' URIs, the run id) and
the task config it injects for each ``TASK_CONFIG`` input, the JSON of its ``TaskConfig`` in
``inputs.parameterValues`` (kubeflow/pipelines ``backend/src/v2/driver``, pipelines#12185).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml

from components.train.config import TrainConfig, from_argv
from components.train.launcher.cluster.trainjob import TRAINING_RUNTIME, TRAINJOB
from components.train.summary import parse
from components.train.tests.cluster_jobs import complete, write_kubeconfig
from pipeline.build import compile_pipeline
from pipeline.checks import check_step
from standins.commands import StartedCommand
from standins.kmock_cluster import (
    NS,
    TRAINJOB_KIND,
    Cluster,
    Operator,
    TrainerOperator,
    local_equivalent,
    pod,
)
from standins.waiting import HANG_S, join, wait_until

pytestmark = pytest.mark.timeout(120)

REPO = Path(__file__).resolve().parents[1]
TASK_POD, TASK_POD_UID = "train-task-pod", "uid-train-7"


@pytest.fixture(scope="module")
def compiled(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The compiled pipeline, as uploaded: its spec and its Kubernetes platform spec (the YAML's
    two documents) in one mapping."""
    path = compile_pipeline(tmp_path_factory.mktemp("p") / "p.yaml")
    spec, platform = yaml.safe_load_all(path.read_text())
    return dict(spec) | dict(platform)


def _cluster(*kinds: Any, trainer: str | None = None) -> Iterator[Cluster]:
    with Cluster(*kinds, trainer=trainer) as c:
        c.core.create_namespaced_pod(NS, pod(TASK_POD, {}, uid=TASK_POD_UID))  # the step's pod
        yield c
    Step.stop_all()


@pytest.fixture
def cluster() -> Iterator[Cluster]:
    """A cluster serving MPIJob, TrainJob and TrainingRuntime."""
    yield from _cluster()


@pytest.fixture
def trainer_cluster() -> Iterator[Cluster]:
    """A stock Kubeflow platform, 26.03: Kubeflow Trainer v2.1.0, no mpi-operator."""
    yield from _cluster((TRAINJOB, TRAINING_RUNTIME), trainer="v2.1.0")


def run_values(compiled: dict[str, Any], bucket: str, **overrides: Any) -> dict[str, Any]:
    """The run's parameters: the compiled defaults and what a user sets for a TrainJob run."""
    values = {  # the YAML's numbers are doubles; KFP's driver casts
        name: int(p["defaultValue"]) if p["parameterType"] == "NUMBER_INTEGER" else p.get(
            "defaultValue")
        for name, p in compiled["root"]["inputDefinitions"]["parameters"].items()
    }  # fmt: skip
    return values | {
        "training_backend": "trainjob", "namespace": NS, "registry_root": f"{bucket}/models",
        "epochs": 3,  # and one value of the user's own, to follow into the TrainJob
    } | overrides  # fmt: skip


def driver_task_config(
    compiled: dict[str, Any], values: dict[str, Any], author: dict[str, Any]
) -> dict[str, Any]:
    """The train task's TaskConfig as KFP's driver fills it (``backend/src/v2/driver/k8s.go``):
    the node selector and tolerations the compiled pipeline sets on the task with kfp-kubernetes,
    resolved from the run's values, and what a pipeline author set on the task besides
    (`author`; the driver takes a node selector's JSON over its labels, and appends tolerations)."""
    k8s = compiled["platforms"]["kubernetes"]["deploymentSpec"]["executors"]["exec-train"]
    selector = values[k8s["nodeSelector"]["nodeSelectorJson"]["componentInputParameter"]]
    tolerations = [t for entry in k8s["tolerations"]
                   for t in values[entry["tolerationJson"]["componentInputParameter"]]]  # fmt: skip
    tolerations += author.get("tolerations", [])
    return author | {"nodeSelector": selector, "tolerations": tolerations}


def executor_input(
    compiled: dict[str, Any], bucket: str, run_id: str, out: Path,
    task_config: dict[str, Any] | None = None, **overrides: Any,
) -> dict:  # fmt: skip
    """The train task's executor input, as KFP's driver resolves it from the compiled task
    (`task_config`: what a pipeline author set on the task, as the driver's TaskConfig JSON)."""
    values = run_values(compiled, bucket, **overrides)
    check = compiled["root"]["dag"]["tasks"]["check-parameters"]["inputs"]["parameters"]
    checked = check_step(images=check["images"]["runtimeValue"]["constant"], **values)
    task = compiled["root"]["dag"]["tasks"]["train"]["inputs"]["parameters"]
    component = compiled["components"]["comp-train"]
    parameters: dict[str, Any] = {}
    for name, definition in component["inputDefinitions"]["parameters"].items():
        if definition["parameterType"] == "TASK_CONFIG":  # the driver's, not the task's
            parameters[name] = driver_task_config(compiled, values, task_config or {})
            continue
        source = task[name]
        if "componentInputParameter" in source:
            parameters[name] = values[source["componentInputParameter"]]
        elif source.get("taskOutputParameter", {}).get("outputParameterKey") == "trainer_image":
            parameters[name] = checked.trainer_image
        else:
            assert source["runtimeValue"]["constant"] == "{{$.pipeline_job_uuid}}", name
            parameters[name] = run_id
    root = f"{bucket}/pipeline-root/{run_id}"

    def artifacts(definitions: dict[str, Any], task_name: str) -> dict[str, Any]:
        """Each artifact where KFP puts a task's: under the run's pipeline root."""
        return {
            name: {"artifacts": [{"name": name, "type": d["artifactType"], "metadata": {},
                                  "uri": f"{root}/{task_name}/{name}"}]}
            for name, d in definitions["artifacts"].items()
        }  # fmt: skip

    return {
        "inputs": {
            "parameterValues": parameters,
            "artifacts": artifacts(component["inputDefinitions"], "publish-dataset"),
        },
        "outputs": {
            "artifacts": artifacts(component["outputDefinitions"], "train"),
            "outputFile": str(out / "executor_output.json"),
        },
    }


def prepare_dataset(bucket: str, run_id: str) -> None:
    """The run's dataset where the publish step puts it: what the train step checks, and its
    ranks read."""
    from components.data_prep.prep import prepare

    root = f"{bucket}/pipeline-root/{run_id}/publish-dataset/dataset"
    prepare("bundled", root, shard_size=200, data_limit=400)


class Step:
    """One attempt of the train task: the compiled executor in a subprocess, its output read
    line by line."""

    started: list[Step] = []

    def __init__(self, compiled: dict[str, Any], cluster: Cluster, bucket: str, run_id: str,
                 work: Path, **driver: Any) -> None:  # fmt: skip
        self.work, self.gcs = work, work / "gcs"
        work.mkdir(parents=True)
        self.input = executor_input(compiled, bucket, run_id, work / "out", **driver)
        container = compiled["deploymentSpec"]["executors"]["exec-train"]["container"]
        args = [json.dumps(self.input) if a == "{{$}}" else a for a in container["args"]]
        self.proc = subprocess.Popen(
            [*container["command"], *args], cwd=REPO, env=self._env(cluster),
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
        )  # fmt: skip
        self.job = StartedCommand(self.proc, time.monotonic())
        Step.started.append(self)

    @property
    def lines(self) -> list[str]:
        return [line for _, line in self.job.lines]

    @classmethod
    def stop_all(cls) -> None:
        """A failed test's steps go with it."""
        for step in cls.started:
            if step.proc.poll() is None:
                os.killpg(step.proc.pid, signal.SIGKILL)
        cls.started.clear()

    def _env(self, cluster: Cluster) -> dict[str, str]:
        shim = self.work / "shim"
        shim.mkdir()
        (shim / "sitecustomize.py").write_text(
            "# stands in for the /gcs/ mount KFP's launcher gives the task's pod\n"
            "from kfp.dsl.types import artifact_types\n"
            f"artifact_types._GCS_LOCAL_MOUNT_PREFIX = {str(self.gcs) + '/'!r}\n"
        )
        kubeconfig = write_kubeconfig(self.work / "kubeconfig", cluster)
        env = {k: v for k, v in os.environ.items() if not k.startswith("KUBERNETES_")}
        return env | {
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}",  # its python3
            "PYTHONPATH": f"{shim}{os.pathsep}{REPO}", "PYTHONUNBUFFERED": "1",
            "KUBECONFIG": str(kubeconfig), "HOSTNAME": TASK_POD,  # and gcs_uri's emulator host
        }  # fmt: skip

    def wait_for(self, text: str) -> None:
        """Until the step has printed a line with `text`, while it runs (short of a hang)."""
        wait_until(
            lambda: any(text in line for line in self.lines),
            lambda: f"{text!r} from the step in:\n" + "\n".join(self.lines),
            alive=lambda: self.proc.poll() is None or self.job.reader.is_alive(),
        )

    def wait(self) -> int:
        """The step's exit code, once it has ended and its output is read (short of a hang)."""
        code = self.proc.wait(HANG_S)
        join(self.job.reader, "the reader of the step's output")
        return code

    def executor(self) -> psutil.Process:
        """The process running kfp's executor (under the compiled command's shell)."""
        root = psutil.Process(self.proc.pid)
        for proc in [root, *root.children(recursive=True)]:
            if "kfp.dsl.executor_main" in proc.cmdline():
                return proc
        raise AssertionError("no executor process")

    def output(self, name: str) -> Path:
        """Where the step wrote output artifact `name` (the stand-in /gcs/ mount)."""
        uri = self.input["outputs"]["artifacts"][name]["artifacts"][0]["uri"]
        return self.gcs / uri.removeprefix("gs://")


# A run small enough to train here: 2 nodes x 1 process, the small model, on 400 digits.
TINY = {"workers": 2, "slots_per_worker": 1, "epochs": 3, "model": "small", "warmup_epochs": 0,
        "batch_size_per_worker": 32, "threads_per_worker": 1}  # fmt: skip


@pytest.mark.horovod
@pytest.mark.timeout(600)
def test_the_train_step_creates_a_trainjob_and_its_retry_reattaches(
    compiled: dict[str, Any], cluster: Cluster, gcs_uri: str, tmp_path: Path
) -> None:
    """The first attempt creates the TrainJob with the run's parameters, then its pod is lost;
    the job runs on to its end (the real trainer, from the stored TrainJob's command); KFP's
    retry (same run id) reattaches, streams the launcher's log and writes the step's outputs
    from what the trainer wrote: one model, its weights identical on both ranks."""
    prepare_dataset(gcs_uri, "run-7")
    op = TrainerOperator(cluster, {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}, TRAINJOB_KIND)
    first = Step(compiled, cluster, gcs_uri, "run-7", tmp_path / "attempt-1", **TINY)
    first.wait_for("created TrainJob")
    name = op.wait_for_job()
    os.killpg(first.proc.pid, signal.SIGKILL)  # the task's pod is lost; nothing cleans up
    assert first.wait() == -signal.SIGKILL

    job = op.job(name)
    values = run_values(compiled, gcs_uri, **TINY)
    trainer = job["spec"]["trainer"]
    config = from_argv(local_equivalent(trainer["command"])[1])
    assert {
        p.name: getattr(config, p.name) for p in TrainConfig.parameters(pipeline_only=True)
    } == {p.name: values[p.name] for p in TrainConfig.parameters(pipeline_only=True)}
    assert (trainer["numNodes"], trainer["numProcPerNode"]) == (2, 1)
    assert trainer["image"] == first.input["inputs"]["parameterValues"]["trainer_image"]
    assert trainer["resourcesPerNode"]["limits"] == {
        "cpu": values["cpu_per_worker"], "memory": values["memory_per_worker"],
    }  # fmt: skip
    assert job["metadata"]["annotations"]["kfp-horovod/pipeline-run-id"] == "run-7"
    assert job["metadata"]["ownerReferences"][0]["uid"] == TASK_POD_UID
    assert op.serve(name) == 0  # the job runs on without its task, to the end

    retry = Step(compiled, cluster, gcs_uri, "run-7", tmp_path / "attempt-2", **TINY)
    assert retry.wait() == 0, "\n".join(retry.lines)
    assert f"reattached to TrainJob {NS}/{name} (Succeeded) from an earlier attempt" in retry.lines
    served = [line for _, line in op.lines if "<stdout>:[rank 0/2]" in line]
    assert any(line.startswith("[1,0]<stdout>:[rank 0/2] Epoch 3/3 - loss") for line in served)
    assert [line for line in retry.lines if "<stdout>:[rank 0/2]" in line] == served
    assert cluster.job_names(TRAINJOB) == [name] and op.starts == 1
    assert len(cluster.requests("POST", "/trainjobs")) == 2  # created once, then a 409
    summary = parse(retry.output("run_summary").read_text())
    assert (summary.world_size, summary.model_uri) == (2, config.model_dir)
    assert summary.weights_identical_across_ranks is True  # the trainer's finding
    report = retry.output("coordination_report").read_text()
    assert "**identical on all 2 ranks**" in report
    metadata = json.loads((tmp_path / "attempt-2" / "out" / "executor_output.json").read_text())
    model = metadata["artifacts"]["saved_model"]["artifacts"][0]["metadata"]
    assert (model["world_size"], model["epochs"]) == (2, 3)


def test_sigterm_to_the_train_step_deletes_its_trainjob(
    compiled: dict[str, Any], cluster: Cluster, gcs_uri: str, tmp_path: Path
) -> None:
    """KFP cancels the run: the executor, sent SIGTERM while it streams the launcher's log,
    deletes the TrainJob, waits for its pods to go, and fails naming the cancellation."""
    prepare_dataset(gcs_uri, "run-8")
    op = Operator(cluster, TRAINJOB_KIND)
    step = Step(compiled, cluster, gcs_uri, "run-8", tmp_path / "attempt-1")
    step.wait_for("created TrainJob")
    name = op.wait_for_job()
    op.say(op.start(name), "[1,0]<stdout>:[rank 0/2] Epoch 1/3 - loss 0.9")
    step.wait_for("[1,0]<stdout>:[rank 0/2] Epoch 1/3 - loss 0.9")  # streamed as it runs
    op.play(lambda op: op.collect(name))  # the garbage collector

    step.executor().send_signal(signal.SIGTERM)
    code = step.wait()
    op.join()
    assert code != 0
    assert f"cancelled; TrainJob {NS}/{name} deleted" in step.lines[-1], "\n".join(step.lines)
    assert cluster.job_names(TRAINJOB) == [] and cluster.pod_names() == sorted(
        ["unrelated", TASK_POD]
    )
    assert not step.output("run_summary").exists()


SPOT = {"key": "cloud.google.com/gke-spot", "operator": "Equal", "value": "true",
        "effect": "NoSchedule"}  # fmt: skip
TEAM = {"key": "team", "operator": "Equal", "value": "ml", "effect": "NoSchedule"}
TASK_CONFIG = {  # what a pipeline author sets on the task with kfp-kubernetes' add_toleration, ...
    "tolerations": [SPOT],
    "affinity": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": 1, "preference": {"matchExpressions": [
            {"key": "zone", "operator": "In", "values": ["a"]}]}}]}},
    "env": [{"name": "MY_FLAG", "value": "1"}],
    "volumes": [{"name": "scratch", "emptyDir": {}}],
    "volumeMounts": [{"name": "scratch", "mountPath": "/scratch"}],
    "resources": {"limits": {"cpu": "3", "memory": "6Gi"},
                  "requests": {"cpu": "3", "memory": "6Gi"}},
}  # fmt: skip
PLACED = {"training_backend": "auto", "node_selector": {"pool": "training"}, "tolerations": [TEAM]}


def test_auto_picks_the_trainjob_and_the_task_config_is_on_its_pod_templates(
    compiled: dict[str, Any], trainer_cluster: Cluster, gcs_uri: str, tmp_path: Path
) -> None:
    """``auto`` on a Trainer-only cluster says so first; the placement parameters (the node
    selector and tolerations KFP's driver puts in the task config) and the author's own task
    config land on the TrainJob's pod templates; the backend is recorded. Its
    Trainer, v2.1.0, has no TrainJob deadline field: the step sends none and keeps the
    deadline itself, and the run summary says so."""
    prepare_dataset(gcs_uri, "run-9")
    cluster, op = trainer_cluster, Operator(trainer_cluster, TRAINJOB_KIND)
    step = Step(compiled, cluster, gcs_uri, "run-9", tmp_path / "a", task_config=TASK_CONFIG,
                **PLACED)  # fmt: skip
    step.wait_for("created TrainJob")
    name = op.wait_for_job()
    complete(op, name, op.start(name))
    assert step.wait() == 0, "\n".join(step.lines)
    echoed = step.lines.index("}", next(i for i, x in enumerate(step.lines) if "Got executor" in x))
    own = step.lines[echoed + 1 :]  # after kfp's executor's own lines and its input's echo
    assert own[0].startswith(
        "training_backend=auto chose trainjob: this cluster serves TrainJob "
        "trainer.kubeflow.org/v1alpha1 and not MPIJob"
    ), "\n".join(step.lines)  # the step's first line (kfp's executor logs its own before)
    (post,) = cluster.requests("POST", "/trainjobs")
    trainjob = json.loads(post.body)  # the TrainJob the step created, as sent
    trainer = trainjob["spec"]["trainer"]
    assert trainer["resourcesPerNode"]["limits"] == {"cpu": "3", "memory": "6Gi"}
    assert "MY_FLAG" in trainer["command"]  # forwarded to the ranks by mpirun -x
    assert "activeDeadlineSeconds" not in trainjob["spec"]
    (post,) = cluster.requests("POST", "/trainingruntimes")
    runtime = json.loads(post.body)  # the pod templates: the step's own, not the stand-in's pods
    assert runtime["metadata"]["name"] == trainjob["spec"]["runtimeRef"]["name"]
    for replicated in runtime["spec"]["template"]["spec"]["replicatedJobs"]:
        spec = replicated["template"]["spec"]["template"]["spec"]
        assert spec["nodeSelector"] == {"pool": "training"}  # the node_selector parameter
        assert spec["tolerations"] == [TEAM, SPOT] and spec["affinity"] == TASK_CONFIG["affinity"]
        assert spec["volumes"] == TASK_CONFIG["volumes"]
        assert spec["containers"][0]["volumeMounts"] == TASK_CONFIG["volumeMounts"]
        assert {"name": "MY_FLAG", "value": "1"} in spec["containers"][0]["env"]
    summary = json.loads(step.output("run_summary").read_text())
    assert summary["training_backend"] == "trainjob" and summary["deadline_enforced_by"] == "step"
    report = step.output("coordination_report").read_text()
    assert "- Backend: **trainjob**" in report and "- Deadline enforced by: **step**" in report
    assert any(line.startswith("deadline: 21600 s (active_deadline_seconds), enforced by the "
                               "train step") for line in own)  # fmt: skip
    metadata = json.loads((tmp_path / "a" / "out" / "executor_output.json").read_text())
    run = metadata["artifacts"]["run_summary"]["artifacts"][0]["metadata"]
    assert run["training_backend"] == "trainjob"
