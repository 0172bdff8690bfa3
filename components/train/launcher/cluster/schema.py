"""The schema of a custom resource as a cluster serves it, and whether it has a field. Runs in the
train step's pod (from the API) and in the pipeline's CLI (``render-*``, from a vendored CRD
file).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kubernetes.client import ApiClient

    from components.common.crd import Crd

OPENAPI_V3 = "/openapi/v3/apis/{group}/{version}"
REF = "#/components/schemas/"


@dataclass(frozen=True)
class Schema:
    """A resource's schema (`root`), with the named schemas its ``$ref``s point to."""

    root: Mapping[str, Any]
    named: Mapping[str, Any] = field(default_factory=dict)

    def _resolved(self, node: Mapping[str, Any]) -> Mapping[str, Any]:
        """`node` with its ``$ref`` followed and its ``allOf`` parts' properties merged in."""
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith(REF):
            node = self.named.get(ref.removeprefix(REF), {})
        merged = dict(node)
        for part in node.get("allOf") or []:
            part = self._resolved(part)
            own = merged.get("properties") or {}
            merged["properties"] = {**(part.get("properties") or {}), **own}
        return merged

    def has(self, path: tuple[str, ...]) -> bool:
        """Whether an object of this schema keeps the field at `path` (one that an object
        preserving unknown fields would keep counts)."""
        node = self._resolved(self.root)
        for key in path:
            properties = node.get("properties") or {}
            if key not in properties:
                return bool(node.get("x-kubernetes-preserve-unknown-fields"))
            node = self._resolved(properties[key])
        return True


# The train step reads the schema from the API's OpenAPI v3 document
# (``/openapi/v3/apis/<group>/<version>``), which every authenticated user may read, as API
# discovery: reading the CRD itself would need a cluster-wide right.
def served_schema(api_client: ApiClient, crd: Crd) -> Schema | None:
    """`crd`'s schema from the cluster's OpenAPI v3 document; None if the cluster publishes
    none for it (no document, or none the caller may read)."""
    from kubernetes.client.exceptions import ApiException

    try:
        doc = api_client.call_api(
            OPENAPI_V3.format(group=crd.group, version=crd.version),
            "GET",
            header_params={"Accept": "application/json"},
            auth_settings=["BearerToken"],
            response_type="object",
            _return_http_data_only=True,
        )
    except ApiException as exc:
        if exc.status in (401, 403, 404, 406):
            return None
        raise
    named = ((doc or {}).get("components") or {}).get("schemas") or {}
    wanted = {"group": crd.group, "version": crd.version, "kind": crd.kind}
    for schema in named.values():
        if wanted in schema.get("x-kubernetes-group-version-kind", []):
            return Schema(schema, named)
    return None
