"""Placement on both backends: what the train task's KFP task config passes through (the
pipeline's ``node_selector`` and ``tolerations`` take that path, set on the task with
kfp-kubernetes) on every pod that runs a rank, and on the MPIJob's launcher; CRD-valid; and in
the objects a run creates through the real ``kubernetes`` client on kmock's API.

What is checked is the project's own pod templates, as built and as sent to the API: the pods
the stand-in operators (`standins.kmock_cluster`) make from them are not.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from kfp import dsl

from components.train.launcher.cluster.job import ClusterJobParams, PodConfig, job_kind, validated
from components.train.launcher.parameters import TrainStep
from components.train.step.program import pod_config
from components.train.tests.cluster_jobs import (
    BOTH,
    NAME,
    complete,
    make_params,
    pair,
    pod_specs,
    run,
)
from standins.kmock_cluster import NS, Cluster, Operator

SELECTOR = {"cloud.google.com/gke-accelerator": "nvidia-l4", "cloud.google.com/gke-spot": "true"}
TEAM = {"key": "team", "operator": "Equal", "value": "ml", "effect": "NoSchedule"}
GPU = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}


def params(gpus: int = 1, **overrides: Any) -> ClusterJobParams:
    placed = {"node_selector": SELECTOR, "tolerations": [TEAM, GPU]}
    placed = {} if "task_config" in overrides else placed  # the one way placement comes
    return make_params(
        "gs://b",
        workers=3,
        slots_per_worker=1,
        gpus_per_worker=gpus,
        run_name="placed",
        **(placed | overrides),
    )


@BOTH
def test_every_pod_is_placed_and_tolerates_the_gpu_taint_once(name: str) -> None:
    """The launcher (the MPIJob's runs no rank) goes to the same pool; it asks for no GPU."""
    specs = pod_specs(validated(job_kind(name), params(), NS)[0])  # the vendored CRDs
    assert len(specs) == 2
    for spec in specs:
        assert spec["nodeSelector"] == SELECTOR
        assert spec["tolerations"] == [TEAM, GPU]  # the user's GPU toleration, once
    for spec in pod_specs(validated(job_kind(name), params(0, tolerations=[TEAM]), NS)[0]):
        assert spec["tolerations"] == [TEAM]  # no GPU asked for, no GPU toleration
    for spec in pod_specs(job_kind(name).build(params(0, tolerations=[], node_selector={}), NS)):
        assert "nodeSelector" not in spec and "tolerations" not in spec
    bare = pod_specs(job_kind(name).build(params(tolerations=[], node_selector={}), NS))
    launcher = [None] if name == "mpijob" else [[GPU]]  # the MPIJob's asks for no GPU
    assert [spec.get("tolerations") for spec in bare] == [*launcher, [GPU]]


def test_the_task_config_reaches_every_rank_pod_of_both_backends() -> None:
    spot = {
        "key": "cloud.google.com/gke-spot",
        "operator": "Equal",
        "value": "true",
        "effect": "NoSchedule",
    }
    affinity = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a", "b"]}]}
                ]
            }
        }
    }
    passed = PodConfig(
        node_selector={"pool": "gpu"},
        tolerations=[spot, TEAM],
        affinity=affinity,
        env=[{"name": "MY_FLAG", "value": "1"}],
        volumes=[{"name": "scratch", "emptyDir": {}}],
        volume_mounts=[{"name": "scratch", "mountPath": "/scratch"}],
    )
    p = params(task_config=passed)
    runtime, trainjob = validated(job_kind("trainjob"), p, NS)[0]
    specs = pod_specs([runtime, *validated(job_kind("mpijob"), p, NS)[0]])
    # the TrainJob's node and launcher (node 0), the MPIJob's launcher (no GPU) and workers
    gpu, no_gpu = [spot, TEAM, GPU], [spot, TEAM]
    assert [spec["tolerations"] for spec in specs] == [gpu, gpu, no_gpu, gpu]
    for spec in specs:
        assert spec["nodeSelector"] == {"pool": "gpu"}
        assert spec["affinity"] == affinity and spec["volumes"] == passed.volumes
        container = spec["containers"][0]
        assert {"name": "MY_FLAG", "value": "1"} in container["env"]
        assert container["volumeMounts"] == passed.volume_mounts
    command = trainjob["spec"]["trainer"]["command"]
    assert command[command.index("MY_FLAG") - 1] == "-x"  # the ranks on other nodes get it


def test_an_env_name_the_job_sets_itself_is_refused() -> None:
    with pytest.raises(ValueError, match="env 'PYTHONUNBUFFERED' from the train task's config"):
        params(task_config=PodConfig(env=[{"name": "PYTHONUNBUFFERED", "value": "0"}]))


@BOTH
def test_the_objects_a_run_creates_carry_the_task_configs_placement(
    cluster: Cluster, gcs_uri: str, name: str
) -> None:
    """From the ``dsl.TaskConfig`` KFP's driver hands the train step (filled from the
    pipeline's node_selector and tolerations) to the objects the run sends the API server."""
    b, kind = pair(name)
    passed = dsl.TaskConfig(node_selector=SELECTOR, tolerations=[TEAM])
    p = make_params(gcs_uri, gpus_per_worker=2, task_config=pod_config(passed))
    op = Operator(cluster, kind)
    op.play(lambda op: complete(op, NAME, op.start(op.wait_for_job())))
    run(cluster, b, p, lambda _: None)
    op.join()
    sent = [
        json.loads(r.body)
        for crd in (*b.shared, b.crd)
        for r in cluster.requests("POST", f"/{crd.plural}")
    ]
    specs = pod_specs(sent)
    assert len(sent) == 1 + len(b.shared) and len(specs) == 2
    assert all(spec["nodeSelector"] == SELECTOR for spec in specs)
    launcher = [TEAM] if name == "mpijob" else [TEAM, GPU]  # the MPIJob's asks for no GPU
    assert [spec["tolerations"] for spec in specs] == [launcher, [TEAM, GPU]]


def test_the_task_configs_resources_size_the_workers_unless_a_parameter_says_otherwise() -> None:
    from components.train.step.program import worker_resources

    step = TrainStep()
    limits = {"limits": {"cpu": "8", "memory": "30Gi", "nvidia.com/gpu": "1"}}
    sized = worker_resources(limits, step, 1)  # parameters left at their defaults give way
    assert (sized.cpu_per_worker, sized.memory_per_worker) == ("8", "30Gi")
    assert worker_resources({"requests": {"cpu": "500m"}}, step, 1).cpu_per_worker == "500m"
    eight = TrainStep(cpu_per_worker="8")
    assert worker_resources({"limits": {"cpu": "8"}}, eight, 1) == eight  # they agree
    assert worker_resources({"limits": {"nvidia.com/gpu": "0"}}, step, 1) == step
    with pytest.raises(ValueError) as info:
        worker_resources(limits, TrainStep(cpu_per_worker="4"), 2)
    assert str(info.value) == (
        "the train task's config and the pipeline's parameters disagree: cpu: the "
        "cpu_per_worker parameter says '4', the train task's config says '8'; nvidia.com/gpu: "
        "the gpus_per_worker parameter says 2, the train task's config says '1'"
    )
