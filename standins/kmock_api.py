"""The API server's handling of custom resources, which kmock's emulator does not play: played
here for the CRDs a `standins.kmock_cluster.Cluster` serves, from their vendored files (the
MPIJob's, and Kubeflow Trainer's of the release a test names, `trainer_crds`).

This stands in for the Kubernetes API server, and behaves as it does where the project relies
on it:

* Pruning. On create, the fields a CRD's structural schema does not have are dropped, silently
  (``fieldValidation`` Ignore or Warn, the server's default; the server's Warning header is left
  out). With ``fieldValidation=Strict`` the create is refused instead, 400 BadRequest naming
  every such field as the server does (``TrainJob in version "v1alpha1" cannot be handled as a
  TrainJob: strict decoding error: unknown field "spec.x"``). What a client sent stays in the
  recorded request's body; its ``data`` is what the server kept.
* The OpenAPI v3 document of each served group version (``/openapi/v3/apis/<group>/<version>``,
  which any authenticated user may read): each kind's schema under ``components.schemas``, named
  by its reversed group, version and kind and tagged ``x-kubernetes-group-version-kind``, its
  ``metadata`` a reference to ObjectMeta, as the server publishes a CRD's (its paths left out).

`prune` is that pruning; the manifest tests use it too, to find what a release's server would
drop from a manifest.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import cache
from pathlib import Path
from typing import Any

import kmock
from typing_extensions import override

from components.common.crd import Crd, crd_schema, find_crd
from components.train.launcher.cluster.trainjob import TRAINJOB

Schema = Mapping[str, Any]
OBJECT_META = "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"
# The server's own fields of a resource (and of an embedded one), which no CRD schema prunes.
OWN = ("apiVersion", "kind", "metadata")


def trainer_crds(version: str) -> Path:
    """The folder of Kubeflow Trainer `version`'s vendored CRDs (deploy/crd/trainer/<version>)."""
    folder = find_crd(TRAINJOB).parents[1] / version
    assert folder.is_dir(), f"no vendored CRDs of Kubeflow Trainer {version} in {folder.parent}"
    return folder


@cache
def schema_of(crd: Crd, folder: Path | None = None) -> Schema:
    """`crd`'s ``openAPIV3Schema``: its file in `folder` (a Trainer release's), else the
    vendored one the project builds against."""
    return crd_schema(crd, folder / crd.relative_path.name if folder else find_crd(crd))


def served_schemas(kinds: tuple[Crd, ...], trainer: str | None) -> dict[Crd, Schema]:
    """The schema of each of `kinds`: Trainer's of release `trainer` (default: the project's)."""
    folder = trainer_crds(trainer) if trainer else None
    return {crd: schema_of(crd, folder if crd.group == TRAINJOB.group else None) for crd in kinds}


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def prune(value: Any, schema: Schema, path: str = "") -> tuple[Any, list[str]]:
    """`value` without what the structural `schema` does not have, and the dropped fields'
    paths (``spec.trainer.numNode``, ``spec.env[0].x``), as the API server prunes a custom
    resource; the resource's own apiVersion, kind and metadata are the server's to check."""
    if isinstance(value, list):
        items = schema.get("items") or {}
        pairs = [prune(item, items, f"{path}[{i}]") for i, item in enumerate(value)]
        return [kept for kept, _ in pairs], [field for _, lost in pairs for field in lost]
    if not isinstance(value, dict):
        return value, []
    props, extra = schema.get("properties") or {}, schema.get("additionalProperties")
    keep_unknown = schema.get("x-kubernetes-preserve-unknown-fields", False)
    own = OWN if not path or schema.get("x-kubernetes-embedded-resource") else ()
    kept: dict[str, Any] = {}
    dropped: list[str] = []
    for key, item in value.items():
        sub = props.get(key, extra if isinstance(extra, dict) else None)
        if key in own or (sub is None and keep_unknown):
            kept[key] = item
        elif sub is None:
            dropped.append(_join(path, key))
        else:
            kept[key], lost = prune(item, sub, _join(path, key))
            dropped += lost
    return kept, dropped


def openapi_v3(schemas: Mapping[Crd, Schema]) -> dict[str, Any]:
    """The OpenAPI v3 document a server publishes for the CRDs of `schemas` (one group
    version)."""
    published: dict[str, Any] = {OBJECT_META: {"type": "object", "properties": {}}}
    for crd, schema in schemas.items():
        name = ".".join([*reversed(crd.group.split(".")), crd.version, crd.kind])
        meta = {"allOf": [{"$ref": f"#/components/schemas/{OBJECT_META}"}], "default": {}}
        published[name] = {
            **schema,
            "properties": {**schema["properties"], "metadata": meta},
            "x-kubernetes-group-version-kind": [
                {"group": crd.group, "kind": crd.kind, "version": crd.version}
            ],
        }
    return {"openapi": "3.0.0", "info": {"title": "Kubernetes CRD Swagger", "version": "v0.1.0"},
            "paths": {}, "components": {"schemas": published}}  # fmt: skip


class Emulator(kmock.KubernetesEmulator):
    """kmock's emulator with the API server's handling of the custom resources it `serve`s."""

    crds: dict[tuple[str, str, str], tuple[Crd, Schema]]

    def serve(self, schemas: Mapping[Crd, Schema]) -> None:
        """Serve the resources of `schemas` (discovery, objects, status), prune and refuse with
        their schemas, and publish them in the OpenAPI v3 documents of their group versions."""
        self.crds = {(c.group, c.version, c.plural): (c, s) for c, s in schemas.items()}
        for crd in schemas:
            self.resources[f"{crd.api_version}/{crd.plural}"] = kmock.ResourceInfo(
                namespaced=True, kind=crd.kind, verbs={"create", "get", "list", "delete", "patch"},
                subresources={"status"},
            )  # fmt: skip
        for group_version in {crd.api_version for crd in schemas}:
            same = {c: s for c, s in schemas.items() if c.api_version == group_version}
            self[f"get /openapi/v3/apis/{group_version}"] << openapi_v3(same)

    @override
    async def _handle(self, request: kmock.Request) -> Any:
        """A create of a served custom resource, pruned, or refused under Strict validation,
        before kmock stores it."""
        resource = request.resource
        key = (resource.group, resource.version, resource.plural) if resource else None
        found = getattr(self, "crds", {}).get(key)
        if found and request.action == kmock.action.CREATE and isinstance(request.data, dict):
            crd, schema = found
            kept, unknown = prune(request.data, schema)
            if unknown and request.params.get("fieldValidation") == "Strict":
                fields = ", ".join(f'unknown field "{field}"' for field in unknown)
                raise kmock.KubernetesError(
                    status=400, reason="BadRequest", details={"kind": crd.kind},
                    message=f'{crd.kind} in version "{crd.version}" cannot be handled as a '
                    f"{crd.kind}: strict decoding error: {fields}",
                )  # fmt: skip
            object.__setattr__(request, "data", kept)
        return await super()._handle(request)
