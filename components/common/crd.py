"""Check a manifest against its CustomResourceDefinition's schema offline (vendored under
``deploy/crd/``; for a backend, the copy packaged beside it). Runs in the pipeline's CLI (the
``render-*`` commands), in the train step's pod before it creates a job, and in the tests.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml

from components.common.failure import ExpectedError, InputError


class CrdNotFound(ExpectedError, FileNotFoundError):
    """No vendored CRD file in this checkout or above it (give the command the file's path)."""


class ManifestError(InputError):
    """The manifest does not match its CRD; the message names each bad field."""


@dataclass(frozen=True)
class Crd:
    """One custom resource: its API coordinates, its vendored CRD file (relative to the
    repository's root) and the packaged copy of its schema (None: used only in a checkout)."""

    group: str
    version: str
    kind: str
    plural: str
    relative_path: Path
    packaged_schema: Path | None = None

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}"


def find_crd(crd: Crd, start: Path | None = None) -> Path:
    """`crd`'s vendored file in `start` (default: this module) or a folder above it: in a
    checkout, the repository's root."""
    here = (start or Path(__file__)).resolve()
    for folder in [here, *here.parents]:
        candidate = folder / crd.relative_path
        if candidate.is_file():
            return candidate
    raise CrdNotFound(f"no {crd.relative_path} in {here} or any folder above it")


def crd_schema(crd: Crd, path: Path) -> dict[str, Any]:
    """The ``openAPIV3Schema`` of `crd`'s version in the CRD file at `path`; InputError, one
    line, for a file that is missing, unreadable, not YAML or not that CRD."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise InputError(f"cannot read the {crd.kind} CRD {path}: {exc.strerror or exc}") from None
    try:  # libyaml's loader when PyYAML has it: the CRDs are large (KServe's: 2 MB, 18 s in Python)
        doc = yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except yaml.YAMLError as exc:
        problem = str(exc).splitlines()[0]
        raise InputError(
            f"{path} is not the {crd.group} {crd.kind} CRD: not YAML ({problem})"
        ) from None
    doc = doc if isinstance(doc, dict) else {}  # a list, a string: not a CRD
    spec: dict[str, Any] = doc["spec"] if isinstance(doc.get("spec"), dict) else {}
    names: dict[str, Any] = spec["names"] if isinstance(spec.get("names"), dict) else {}
    if (
        doc.get("kind") != "CustomResourceDefinition"
        or spec.get("group") != crd.group
        or names.get("kind", crd.kind) != crd.kind
    ):
        raise InputError(f"{path} is not the {crd.group} {crd.kind} CRD")
    for version in spec.get("versions") or []:
        if isinstance(version, dict) and version.get("name") == crd.version:
            try:
                return dict(version["schema"]["openAPIV3Schema"])
            except (KeyError, TypeError):
                raise InputError(f"{path}: its {crd.version} version has no schema") from None
    raise InputError(f"{path} has no {crd.version} version")


def _close_objects(schema: Any) -> Any:
    """Forbid the properties a schema does not declare where it declares some."""
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


@lru_cache(maxsize=8)
def load_schema(crd: Crd, crd_path: str | None = None) -> dict[str, Any]:
    """The strict jsonschema of `crd` from the CRD file at `crd_path`, else its packaged copy
    (the trainer image has no ``deploy/``), else its vendored CRD."""
    if crd_path:
        schema = crd_schema(crd, Path(crd_path))
    elif crd.packaged_schema:  # equal to the vendored one (``make crd``), and quicker to read
        schema = json.loads(crd.packaged_schema.read_text())
    else:
        schema = crd_schema(crd, find_crd(crd))
    # The CRD leaves `metadata` open (the API server validates ObjectMeta itself).
    return dict(_close_objects(schema))  # it copies as it goes


def write_packaged_schema(crd: Crd) -> None:
    """Refresh `crd`'s packaged schema from its vendored file (``make crd``)."""
    if crd.packaged_schema is None:
        raise ValueError(f"{crd.kind} has no packaged schema")
    schema = crd_schema(crd, find_crd(crd))
    crd.packaged_schema.write_text(json.dumps(schema, sort_keys=True, separators=(",", ":")))


# Where nothing else checks a manifest (the ``render-*`` commands, the manifest tests); what is sent
# to a cluster the API server checks itself (the train step creates with
# ``fieldValidation=Strict``). The check is jsonschema's, with two differences from the API server:
#
# - The API server *prunes* unknown fields of a structural schema silently (unless asked to be
#   strict); here an unknown field is an error (a typo like ``slotPerWorker`` would otherwise vanish
#   on the way in).
# - ``x-kubernetes-*`` extensions (CEL rules among them) are ignored by jsonschema; int-or-string
#   fields already carry an ``anyOf`` of integer and string, which it understands.
def manifest_problems(manifest: dict[str, Any], crd: Crd, crd_path: str | None = None) -> list[str]:
    """Every schema violation in `manifest` as ``field.path: message``; empty if it is valid."""
    problems = []
    if manifest.get("apiVersion") != crd.api_version:
        problems.append(
            f"apiVersion: expected {crd.api_version}, got {manifest.get('apiVersion')!r}"
        )
    if manifest.get("kind") != crd.kind:
        problems.append(f"kind: expected {crd.kind}, got {manifest.get('kind')!r}")
    import jsonschema  # here: rendering's --help and the pure builders need none of it

    validator = jsonschema.Draft7Validator(load_schema(crd, crd_path))
    for error in sorted(validator.iter_errors(manifest), key=lambda e: list(e.absolute_path)):
        path = ".".join(str(part) for part in error.absolute_path) or "<root>"
        problems.append(f"{path}: {error.message}")
    return problems


def raise_problems(manifest: dict[str, Any], crd: Crd, problems: list[str]) -> None:
    """Raise `ManifestError` naming the manifest and listing `problems`, if there are any."""
    if problems:
        name = manifest.get("metadata", {}).get("name", "<unnamed>")
        raise ManifestError(
            f"{crd.kind} {name} does not match the CRD schema: " + "; ".join(problems)
        )
