"""Check an MPIJob manifest against mpi-operator's CRD schema before anything is sent.

The schema is ``spec.versions[v2beta1].schema.openAPIV3Schema`` of
``deploy/crd/kubeflow.org_mpijobs.yaml`` (vendored; a copy is packaged beside this module for
the trainer image), checked strictly by `components.train.cluster.crd`. One check the CRD does
not spell out is added: ``launcherCreationPolicy`` is one of the operator's two values.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from components.train.cluster.crd import Crd, manifest_problems, raise_problems
from components.train.mpijob.manifest import API_GROUP, API_VERSION, KIND, PLURAL

MPIJOB = Crd(
    API_GROUP, API_VERSION, KIND, PLURAL,
    relative_path=Path("deploy") / "crd" / "kubeflow.org_mpijobs.yaml",
    packaged_schema=Path(__file__).with_name("mpijob-v2beta1.schema.json"),
)  # fmt: skip


def mpijob_problems(manifest: dict[str, Any], crd_path: str | None = None) -> list[str]:
    """Every problem with the MPIJob `manifest`; empty if it is valid."""
    problems = manifest_problems(manifest, MPIJOB, crd_path)
    policy = manifest.get("spec", {}).get("launcherCreationPolicy")
    if policy not in (None, "AtStartup", "WaitForWorkersReady"):
        problems.append(
            f"spec.launcherCreationPolicy: must be AtStartup or WaitForWorkersReady, got {policy!r}"
        )
    return problems


def validate_manifest(manifest: dict[str, Any], crd_path: str | None = None) -> None:
    """Raise `ManifestError` listing every problem if `manifest` is not a valid MPIJob."""
    raise_problems(manifest, MPIJOB, mpijob_problems(manifest, crd_path))
