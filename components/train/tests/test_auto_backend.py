"""``training_backend=auto``: the train step asks the cluster's API discovery which job operator
it serves, says its choice first, runs the job there and records the backend.

Real: the train step's program (`components.train.step.program.run_train_task`), the ``kubernetes``
client reaching kmock's API emulator through a kubeconfig (the APIs served chosen per test),
fake-gcs-server. Stood in: the operators (`standins.kmock_cluster.Operator`), which write what
rank 0 would leave instead of training.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes.config import kube_config

from components.common.crd import Crd
from components.train.config import TrainConfig
from components.train.launcher.cluster.job import ClusterJobError
from components.train.launcher.cluster.mpijob import MPIJOB
from components.train.launcher.cluster.trainjob import TRAINING_RUNTIME, TRAINJOB
from components.train.launcher.parameters import TrainStep
from components.train.step.program import run_train_task
from components.train.tests.cluster_jobs import complete, write_kubeconfig
from standins.kmock_cluster import MPIJOB_KIND, NS, TRAINJOB_KIND, Cluster, Kind, Operator

pytestmark = pytest.mark.timeout(120)
BOTH = (MPIJOB, TRAINJOB, TRAINING_RUNTIME)
TRAINER_ONLY = (TRAINJOB, TRAINING_RUNTIME)


@pytest.fixture
def served(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Cluster]:
    """A cluster serving the APIs the test is parametrized with, which the step reaches through
    its kubeconfig (as outside a pod: no in-cluster service account here)."""
    with Cluster(request.param) as cluster:
        kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", cluster)
        # what the client reads from $KUBECONFIG when it is imported, as in the step's process
        monkeypatch.setattr(kube_config, "KUBE_CONFIG_DEFAULT_LOCATION", str(kubeconfig))
        monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
        monkeypatch.delenv("HOSTNAME", raising=False)
        yield cluster


def run_auto(bucket: str, tmp_path: Path, lines: list[str], **train: Any) -> dict[str, Any]:
    from components.data_prep.prep import prepare

    prepare("bundled", f"{bucket}/data", data_limit=100)  # what the step checks before launching
    config = TrainConfig(
        data=f"{bucket}/data",
        output=f"{bucket}/run/train/train-work",
        model_dir=f"{bucket}/run/train/model",
        workers=2,
        **train,
    )
    record = run_train_task(
        config,
        TrainStep(namespace=NS),
        "",
        "",
        (str(tmp_path / "s"), str(tmp_path / "r")),
        "run-1",
        log=lines.append,
    )
    return dataclasses.asdict(record)


def operate(cluster: Cluster, kind: Kind) -> Operator:
    """The operator of `kind` runs the one job the step creates to success."""
    op = Operator(cluster, kind)

    def script(op: Operator) -> None:
        name = op.wait_for_job()
        complete(op, name, op.start(name))

    op.play(script)
    return op


def created(cluster: Cluster, *crds: Crd) -> list[str]:
    return [f"{crd.kind} {n}" for crd in crds for n in cluster.job_names(crd)]


@pytest.mark.parametrize(
    ("served", "kind", "reason"),
    [
        (
            BOTH,
            MPIJOB_KIND,
            "training_backend=auto chose mpijob: this cluster serves both "
            "MPIJob kubeflow.org/v2beta1 (mpi-operator) and TrainJob trainer.kubeflow.org/v1alpha1 "
            "(Kubeflow Trainer); the MPIJob is the stable API and runs elastic jobs",
        ),
        (
            TRAINER_ONLY,
            TRAINJOB_KIND,
            "training_backend=auto chose trainjob: this cluster serves "
            "TrainJob trainer.kubeflow.org/v1alpha1 and not MPIJob kubeflow.org/v2beta1",
        ),
    ],
    indirect=["served"],
    ids=["both-served", "only-trainer"],
)
def test_auto_runs_on_the_operator_the_cluster_serves_and_says_why_first(
    served: Cluster, kind: Kind, reason: str, gcs_uri: str, tmp_path: Path
) -> None:
    op = operate(served, kind)
    lines: list[str] = []
    record = run_auto(gcs_uri, tmp_path, lines)
    op.join()
    assert lines[0] == reason
    assert created(served, *(c for c in (MPIJOB, TRAINJOB) if c in served.kinds)) == [
        f"{kind.crd.kind} {op.wait_for_job()}"
    ]  # one job, of the chosen kind
    backend = "mpijob" if kind is MPIJOB_KIND else "trainjob"
    assert record["training_backend"] == backend
    summary = json.loads((tmp_path / "s").read_text())
    assert (summary["training_backend"], summary["training_backend_reason"]) == (
        backend,
        reason.split(": ", 1)[1],
    )
    assert f"- Backend: **{backend}** ({reason.split(': ', 1)[1]})" in (tmp_path / "r").read_text()


@pytest.mark.parametrize(
    ("served", "train", "error", "message", "said"),
    [
        (
            (),
            {},
            ClusterJobError,
            "training_backend=auto: this cluster serves neither MPIJob kubeflow.org/v2beta1 "
            "nor TrainJob trainer.kubeflow.org/v1alpha1: install mpi-operator v0.8.2 (it also "
            "runs elastic jobs) or Kubeflow Trainer v2.3 (docs/cluster.md); nothing was created",
            [],
        ),
        # the TrainJob refuses an elastic job itself, as training_backend=trainjob would
        (
            TRAINER_ONLY,
            {"min_workers": 1},
            ValueError,
            "invalid TrainJob parameters: "
            "min_workers=1: elastic training needs mpi-operator's discover_hosts.sh, which "
            "Kubeflow Trainer v2 does not provide; use training_backend 'mpijob' (or min_workers "
            "0) instead of 'trainjob'",
            [
                "training_backend=auto chose trainjob: this cluster serves TrainJob "
                "trainer.kubeflow.org/v1alpha1 and not MPIJob kubeflow.org/v2beta1"
            ],
        ),
    ],
    indirect=["served"],
    ids=["neither-served", "elastic-on-trainer-only"],
)
def test_auto_refuses_before_creating_anything(
    served: Cluster,
    train: dict[str, Any],
    error: type[Exception],
    message: str,
    said: list[str],
    gcs_uri: str,
    tmp_path: Path,
) -> None:
    lines: list[str] = []
    with pytest.raises(error) as info:
        run_auto(gcs_uri, tmp_path, lines, **train)
    assert str(info.value) == message
    assert served.requests("POST", "/apis/") == []  # no job, no runtime: nothing created
    assert served.requests("GET", "/apis/kubeflow.org/v2beta1")  # it asked discovery
    assert not (tmp_path / "s").exists() and lines == said
