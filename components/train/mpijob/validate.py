"""Check an MPIJob manifest against mpi-operator's CRD schema before anything is sent.

The schema is ``spec.versions[v2beta1].schema.openAPIV3Schema`` of
``deploy/crd/kubeflow.org_mpijobs.yaml`` (vendored), checked with jsonschema. Two differences from
the API server are made on purpose:

* The API server *prunes* unknown fields of a structural schema silently; here an unknown field
  is an error (a typo like ``slotPerWorker`` would otherwise vanish on the way in).
* ``x-kubernetes-*`` extensions are ignored by jsonschema; int-or-string fields already carry
  an ``anyOf`` of integer and string in this CRD, which jsonschema understands.
"""

from __future__ import annotations

import copy
import json
from functools import lru_cache
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from components.train.mpijob.manifest import API_GROUP, API_VERSION, KIND

# The CRD, vendored in the repository (deploy/crd/SOURCE.md says from where).
CRD_RELATIVE_PATH = Path("deploy") / "crd" / "kubeflow.org_mpijobs.yaml"
# A copy of the CRD's v2beta1 openAPIV3Schema shipped in the package, for the trainer image
# (which has no deploy/ folder). A test keeps it identical to the CRD.
PACKAGED_SCHEMA = Path(__file__).with_name("mpijob-v2beta1.schema.json")


class ManifestError(ValueError):
    """The manifest does not match the MPIJob CRD; the message names each bad field."""


def find_crd(start: Path | None = None) -> Path:
    """Find ``deploy/crd/kubeflow.org_mpijobs.yaml`` in `start` or a folder above it.

    In a checkout that is the repository's root, so the search walks up from this module by
    default; an installed package (the trainer image) has none.
    """
    here = (start or Path(__file__)).resolve()
    for folder in [here, *here.parents]:
        candidate = folder / CRD_RELATIVE_PATH
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(f"no {CRD_RELATIVE_PATH} in {here} or any folder above it")


def _close_objects(schema: Any) -> Any:
    """Forbid properties the schema does not declare (where it declares some and allows no more)."""
    if isinstance(schema, dict):
        out = {key: _close_objects(value) for key, value in schema.items()}
        if (
            "properties" in out
            and "additionalProperties" not in out
            and not out.get("x-kubernetes-preserve-unknown-fields")
        ):
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [_close_objects(item) for item in schema]
    return schema


def crd_schema(path: Path) -> dict[str, Any]:
    """The v2beta1 ``openAPIV3Schema`` of the MPIJob CRD file at `path`."""
    crd = yaml.safe_load(path.read_text())
    if crd.get("kind") != "CustomResourceDefinition" or crd["spec"]["group"] != API_GROUP:
        raise ValueError(f"{path} is not the {API_GROUP} MPIJob CRD")
    for version in crd["spec"]["versions"]:
        if version["name"] == API_VERSION:
            return dict(version["schema"]["openAPIV3Schema"])
    raise ValueError(f"{path} has no {API_VERSION} version")


@lru_cache(maxsize=4)
def load_schema(crd_path: str | None = None) -> dict[str, Any]:
    """The strict jsonschema of MPIJob v2beta1.

    From the CRD at `crd_path`; if None, from the repository's ``deploy/crd/``, or else
    (inside the trainer image) from the copy packaged beside this module.
    """
    if crd_path:
        schema = crd_schema(Path(crd_path))
    else:
        try:
            schema = crd_schema(find_crd())
        except FileNotFoundError:
            schema = json.loads(PACKAGED_SCHEMA.read_text())
    schema = copy.deepcopy(schema)
    # The CRD leaves `metadata` open (the API server validates ObjectMeta itself).
    return dict(_close_objects(schema))


def _path(error: jsonschema.ValidationError) -> str:
    return ".".join(str(part) for part in error.absolute_path) or "<root>"


def manifest_problems(manifest: dict[str, Any], crd_path: str | None = None) -> list[str]:
    """Every schema violation in `manifest` as ``field.path: message``; empty if it is valid."""
    problems = []
    if manifest.get("apiVersion") != f"{API_GROUP}/{API_VERSION}":
        problems.append(
            f"apiVersion: expected {API_GROUP}/{API_VERSION}, got {manifest.get('apiVersion')!r}"
        )
    if manifest.get("kind") != KIND:
        problems.append(f"kind: expected {KIND}, got {manifest.get('kind')!r}")
    validator = jsonschema.Draft7Validator(load_schema(crd_path))
    for error in sorted(validator.iter_errors(manifest), key=lambda e: list(e.absolute_path)):
        problems.append(f"{_path(error)}: {error.message}")
    policy = manifest.get("spec", {}).get("launcherCreationPolicy")
    if policy not in (None, "AtStartup", "WaitForWorkersReady"):
        problems.append(
            f"spec.launcherCreationPolicy: must be AtStartup or WaitForWorkersReady, got {policy!r}"
        )
    return problems


def validate_manifest(manifest: dict[str, Any], crd_path: str | None = None) -> None:
    """Raise `ManifestError` listing every problem if `manifest` is not a valid MPIJob."""
    problems = manifest_problems(manifest, crd_path)
    if problems:
        name = manifest.get("metadata", {}).get("name", "<unnamed>")
        raise ManifestError(f"MPIJob {name} does not match the CRD schema: " + "; ".join(problems))
