"""Placement on both backends: the ``node_selector`` and ``tolerations`` parameters (and what the
train task's KFP task config passes through) on every pod that runs a rank, and on the MPIJob's
launcher; CRD-valid; in the pods the operators make.

The operators are `standins.kmock_cluster`'s stand-ins (mpi-operator; Kubeflow Trainer with
JobSet), which make each pod from its pod template as the real controllers do; the manifests
are created through the real ``kubernetes`` client on kmock's API.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from components.train.cluster.job import ClusterJobParams, PodConfig, backend, validated
from components.train.step import TrainStep
from components.train.tests.cluster_jobs import BOTH, make_params, pair, pod_specs, store
from standins.kmock_cluster import NS, Cluster, Operator

SELECTOR = {"cloud.google.com/gke-accelerator": "nvidia-l4", "cloud.google.com/gke-spot": "true"}
TEAM = {"key": "team", "operator": "Equal", "value": "ml", "effect": "NoSchedule"}
GPU = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}


def params(gpus: int = 1, **overrides: Any) -> ClusterJobParams:
    placed = {"node_selector": json.dumps(SELECTOR), "tolerations": json.dumps([TEAM, GPU])}
    return make_params(
        "gs://b", workers=3, slots_per_worker=1, gpus_per_worker=gpus, run_name="placed",
        **(placed | overrides),
    )  # fmt: skip


@BOTH
def test_every_pod_is_placed_and_tolerates_the_gpu_taint_once(name: str) -> None:
    """The launcher (the MPIJob's runs no rank) goes to the same pool; it asks for no GPU."""
    specs = pod_specs(validated(backend(name), params(), NS)[0])  # the vendored CRDs
    assert len(specs) == 2
    for spec in specs:
        assert spec["nodeSelector"] == SELECTOR
        assert spec["tolerations"] == [TEAM, GPU]  # the user's GPU toleration, once
    for spec in pod_specs(backend(name).build(params(0, tolerations="[]", node_selector="{}"), NS)):
        assert "nodeSelector" not in spec and "tolerations" not in spec


def test_the_task_config_reaches_every_rank_pod_of_both_backends() -> None:
    spot = {"key": "cloud.google.com/gke-spot", "operator": "Equal", "value": "true",
            "effect": "NoSchedule"}  # fmt: skip
    affinity = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [
            {"key": "zone", "operator": "In", "values": ["a", "b"]}]}]}}}  # fmt: skip
    passed = PodConfig(
        node_selector={"pool": "gpu"}, tolerations=[spot, TEAM], affinity=affinity,
        env=[{"name": "MY_FLAG", "value": "1"}], volumes=[{"name": "scratch", "emptyDir": {}}],
        volume_mounts=[{"name": "scratch", "mountPath": "/scratch"}],
    )  # fmt: skip
    p = params(task_config=passed)
    runtime, trainjob = validated(backend("trainjob"), p, NS)[0]
    specs = pod_specs([runtime, *validated(backend("mpijob"), p, NS)[0]])
    assert len(specs) == 4
    for spec in specs:
        assert spec["nodeSelector"] == {**SELECTOR, "pool": "gpu"}
        assert spec["tolerations"] == [TEAM, GPU, spot]
        assert spec["affinity"] == affinity and spec["volumes"] == passed.volumes
        container = spec["containers"][0]
        assert {"name": "MY_FLAG", "value": "1"} in container["env"]
        assert container["volumeMounts"] == passed.volume_mounts
    command = trainjob["spec"]["trainer"]["command"]
    assert command[command.index("MY_FLAG") - 1] == "-x"  # the ranks on other nodes get it


def test_a_label_both_set_differently_is_refused_naming_both() -> None:
    with pytest.raises(ValueError) as info:
        params(task_config=PodConfig(node_selector={"cloud.google.com/gke-spot": "false"}))
    assert str(info.value) == (
        "invalid cluster job parameters: node selector label 'cloud.google.com/gke-spot': the "
        "node_selector parameter says 'true', the train task's config says 'false'"
    )
    params(task_config=PodConfig(node_selector={"cloud.google.com/gke-spot": "true"}))  # agree
    with pytest.raises(ValueError, match="env 'PYTHONUNBUFFERED' from the train task's config"):
        params(task_config=PodConfig(env=[{"name": "PYTHONUNBUFFERED", "value": "0"}]))


@pytest.mark.parametrize(("name", "count"), [("mpijob", 4), ("trainjob", 3)])
def test_the_operators_pods_carry_the_placement(name: str, count: int) -> None:
    b, kind = pair(name)
    with Cluster() as cluster:
        store(cluster, b, b.build(params(), NS))
        op = Operator(cluster, kind)
        op.launcher(op.wait_for_job())
        pods = [p for p in cluster.core.list_namespaced_pod(NS).items
                if p.metadata.name != "unrelated"]  # fmt: skip
    # an MPIJob: a launcher and 3 workers; a TrainJob: the launcher (node 0) and 2 nodes
    assert len(pods) == count
    for pod in pods:
        assert pod.spec.node_selector == SELECTOR, pod.metadata.name
        tolerations = [t.to_dict() for t in pod.spec.tolerations]
        assert [{k: v for k, v in t.items() if v is not None} for t in tolerations] == [TEAM, GPU]


def test_the_task_configs_resources_size_the_workers_unless_a_parameter_says_otherwise() -> None:
    from components.train.task import worker_resources

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
