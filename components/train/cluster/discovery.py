"""Which job operators a cluster serves, from its API discovery (which every authenticated user
may read): `check_api` before a job of a forced backend is sent, `choose_backend` for
``training_backend=auto``.

``auto`` takes the MPIJob (``kubeflow.org/v2beta1``, mpi-operator) where it is served, the
stable API and the one that runs elastic jobs; else the TrainJob (``trainer.kubeflow.org/
v1alpha1``, Kubeflow Trainer v2), which a stock Kubeflow platform install has; else it stops
before anything is created, naming both installs. An elastic job (``min_workers`` > 0) that
only a TrainJob could run is refused by name, as ``training_backend=trainjob`` would be.
"""

from __future__ import annotations

from dataclasses import dataclass

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from components.common import defaults
from components.train.cluster.crd import Crd
from components.train.cluster.lifecycle import JobError

MPIJOB_INSTALL = f"mpi-operator {defaults.MPI_OPERATOR_VERSION}"
TRAINER_INSTALL = f"Kubeflow Trainer {defaults.TRAINER_VERSION.rsplit('.', 1)[0]}"


def serves(api: client.CustomObjectsApi, crd: Crd) -> bool:
    """Whether the cluster serves `crd`'s resource (its group and version's discovery)."""
    try:
        found = api.get_api_resources(crd.group, crd.version)
    except ApiException as exc:
        if exc.status != 404:
            raise
        return False
    return crd.plural in {r.name for r in found.resources or []}


def check_api(api: client.CustomObjectsApi, crd: Crd, install: str) -> None:
    """Raise `JobError` unless the cluster serves `crd`'s resource, naming what to install."""
    if not serves(api, crd):
        raise JobError(
            f"this cluster does not serve {crd.kind} ({crd.plural}.{crd.api_version}): {install}"
        )


@dataclass(frozen=True)
class Choice:
    """The backend ``training_backend=auto`` chose (``mpijob`` or ``trainjob``) and why."""

    backend: str
    reason: str

    @property
    def line(self) -> str:
        """The train step's first line."""
        return f"training_backend=auto chose {self.backend}: {self.reason}"


def _api(crd: Crd) -> str:
    return f"{crd.kind} {crd.api_version}"


def choose_backend(api: client.CustomObjectsApi, min_workers: int = 0) -> Choice:
    """The backend for ``training_backend=auto`` on the cluster `api` reaches; `JobError` when
    it serves neither job API, or only the TrainJob's for an elastic job (`min_workers` > 0)."""
    from components.train.mpijob.validate import MPIJOB
    from components.train.trainjob.manifest import TRAINJOB

    mpijob, trainjob = serves(api, MPIJOB), serves(api, TRAINJOB)
    if mpijob and trainjob:
        return Choice(
            "mpijob", f"this cluster serves both {_api(MPIJOB)} ({MPIJOB_INSTALL.split()[0]}) "
            f"and {_api(TRAINJOB)} (Kubeflow Trainer); the MPIJob is the stable API and runs "
            "elastic jobs",
        )  # fmt: skip
    if mpijob:
        return Choice("mpijob", f"this cluster serves {_api(MPIJOB)} and not {_api(TRAINJOB)}")
    if not trainjob:
        raise JobError(
            f"training_backend=auto: this cluster serves neither {_api(MPIJOB)} nor "
            f"{_api(TRAINJOB)}: install {MPIJOB_INSTALL} (it also runs elastic jobs) or "
            f"{TRAINER_INSTALL} (docs/cluster.md); nothing was created"
        )
    if min_workers:
        raise JobError(
            f"min_workers={min_workers}: training_backend=auto found only {_api(TRAINJOB)} "
            "(Kubeflow Trainer) on this cluster, and elastic training needs mpi-operator's "
            f"discover_hosts.sh, which Trainer does not provide: install {MPIJOB_INSTALL}, or "
            "set min_workers 0; nothing was created"
        )
    return Choice("trainjob", f"this cluster serves {_api(TRAINJOB)} and not {_api(MPIJOB)}")
