"""What the cluster backends' tests share: a run's parameters (by field name, whichever part
declares it), both backends to parametrize over, and the run against kmock's API."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from components.common.crd import Crd
from components.train.config import TrainConfig
from components.train.launcher.cluster.job import (
    ClusterJobKind,
    ClusterJobParams,
    PodConfig,
    job_kind,
    job_name,
)
from components.train.launcher.cluster.run import run_job
from components.train.launcher.parameters import TrainStep
from components.train.summary import RunSummary
from standins.kmock_cluster import NS, Cluster, Operator
from standins.kmock_jobs import MPIJOB_KIND, TRAINJOB_KIND, Kind

POLL = 0.05  # seconds between the run's polls
KINDS = {"mpijob": MPIJOB_KIND, "trainjob": TRAINJOB_KIND}
BOTH = pytest.mark.parametrize("name", list(KINDS))
NAME = job_name("nightly", "run-123")  # make_params' job


def make_params(bucket: str = "gs://bkt", **overrides: Any) -> ClusterJobParams:
    """A 2 x 2 run ``nightly``; `overrides` may name fields of TrainConfig, TrainStep, the task
    config (`PodConfig`) or ClusterJobParams."""
    parts: dict[str, dict[str, Any]] = {
        "train": {
            "data": f"{bucket}/data",
            "output": f"{bucket}/runs/nightly",
            "workers": 2,
            "slots_per_worker": 2,
        },
        "step": {},
        "pod": {},
        "run": {"run_name": "nightly", "pipeline_run_id": "run-123"},
    }
    for name, value in overrides.items():
        part = "train" if name in TrainConfig.__dataclass_fields__ else "run"
        part = "pod" if name in PodConfig.__dataclass_fields__ else part
        parts["step" if name in TrainStep.__dataclass_fields__ else part][name] = value
    if parts["pod"]:
        parts["run"]["task_config"] = PodConfig(**parts["pod"])
    return ClusterJobParams(
        train=TrainConfig(**parts["train"]), step=TrainStep(**parts["step"]), **parts["run"]
    )


def pair(name: str) -> tuple[ClusterJobKind, Kind]:
    """The kind of job backend `name` runs, and the stand-in of its operator."""
    return job_kind(name), KINDS[name]


def run(
    cluster: Cluster, b: ClusterJobKind, p: Any, log: Callable[[str], None], **kw: Any
) -> RunSummary:
    """`run_job` of `p` on backend `b` against `cluster`, polling fast."""
    return run_job(b, p, namespace=NS, api_client=cluster.api, poll_interval_s=POLL, log=log, **kw)


def pod_specs(doc: Any) -> list[dict[str, Any]]:
    """Every pod spec (a mapping with ``containers``) inside `doc`."""
    if isinstance(doc, dict):
        own = [doc] if "containers" in doc else []
        return own + [spec for value in doc.values() for spec in pod_specs(value)]
    if isinstance(doc, list):
        return [spec for item in doc for spec in pod_specs(item)]
    return []


def write_kubeconfig(path: Path, cluster: Cluster) -> Path:
    """A kubeconfig at `path` that reaches `cluster` with a token, as the step's does."""
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "current-context": "kmock",
                "clusters": [{"name": "kmock", "cluster": {"server": cluster.url}}],
                "users": [{"name": "step", "user": {"token": "t"}}],
                "contexts": [{"name": "kmock", "context": {"cluster": "kmock", "user": "step"}}],
            }
        )
    )
    return path


def store(cluster: Cluster, b: ClusterJobKind, manifests: list[dict[str, Any]]) -> None:
    """Store `manifests` (`b`'s shared objects, then its job) as an earlier attempt left them."""
    for crd, m in zip((*b.shared, b.crd), manifests, strict=True):
        cluster.custom.create_namespaced_custom_object(crd.group, crd.version, NS, crd.plural, m)


def posts(cluster: Cluster, crd: Crd) -> int:
    return len(cluster.requests("POST", f"/{crd.plural}"))


def complete(op: Operator, name: str, pod_name: str, *lines: str) -> None:
    """The launcher prints `lines`, rank 0 writes its outputs, the job succeeds."""
    op.say(pod_name, *lines)
    time.sleep(0.2)
    op.write_outputs(name)
    op.finish(name, 0)
