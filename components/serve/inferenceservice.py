"""The KServe InferenceService (``serving.kserve.io/v1beta1``) that serves an alias's serving
folder with TF Serving, validated against KServe's CRD (``deploy/crd/kserve/``). Built by the
pipeline's CLI (``render-inferenceservice``); its pods run on the cluster as the project's
Workload Identity service account.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from components.common import storage
from components.common.crd import Crd, manifest_problems, raise_problems
from components.common.defaults import GPU_RESOURCE, TRAINER_SERVICE_ACCOUNT
from components.common.failure import InputError
from components.common.placement import node_selector_problem, tolerations_problem

INFERENCESERVICE = Crd(
    "serving.kserve.io",
    "v1beta1",
    "InferenceService",
    "inferenceservices",
    relative_path=Path("deploy") / "crd" / "kserve" / "serving.kserve.io_inferenceservices.yaml",
)

POLL_SECONDS = 30
DNS_1035 = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")


# KServe's storage initializer copies ``storageUri`` into the pod once, at start. So that a
# promotion rolls the service forward without a restart, the predictor also passes TF Serving
# ``--model_base_path=<the serving folder>`` (KServe appends it to the runtime's args, overriding
# ``/mnt/models``) and ``--file_system_poll_wait_seconds``: TF Serving then watches the folder on
# GCS itself. ``poll_seconds=0`` leaves it on the pod's copy (a promotion then needs ``kubectl
# rollout restart``). Not tested here beyond the manifest against the CRD.
def build_inferenceservice(
    name: str,
    storage_uri: str,
    *,
    namespace: str | None = None,
    service_account: str = TRAINER_SERVICE_ACCOUNT,
    gpus: int = 0,
    cpu: str = "1",
    memory: str = "2Gi",
    node_selector: dict[str, str] | None = None,
    tolerations: list[dict[str, Any]] | None = None,
    poll_seconds: int = POLL_SECONDS,
    runtime_version: str | None = None,
) -> dict[str, Any]:
    """The InferenceService `name` serving the folder at `storage_uri` (a ``gs://`` URI);
    `node_selector` and `tolerations` are checked by the training job's rules."""
    node_selector, tolerations = node_selector or {}, tolerations or []
    problem = node_selector_problem(node_selector) or tolerations_problem(tolerations)
    if problem:
        raise InputError(problem)
    if not DNS_1035.match(name):
        raise InputError(
            f"name {name!r} is not a valid InferenceService name: lower-case letters, digits "
            "and '-', starting with a letter, at most 63"
        )
    if not storage.is_gcs(storage_uri):
        raise InputError(f"the serving folder must be a gs:// URI on a cluster, got {storage_uri}")
    if gpus < 0 or poll_seconds < 0:
        raise InputError(f"--gpus and --poll-seconds must be >= 0, got {gpus}, {poll_seconds}")
    limits: dict[str, Any] = {"cpu": cpu, "memory": memory}
    if gpus:
        limits[GPU_RESOURCE] = gpus
    model: dict[str, Any] = {
        "modelFormat": {"name": "tensorflow"},
        "storageUri": storage_uri,
        "resources": {"requests": {"cpu": cpu, "memory": memory}, "limits": limits},
    }
    if runtime_version:
        model["runtimeVersion"] = runtime_version
    if poll_seconds:
        model["args"] = [
            f"--model_base_path={storage_uri}",
            f"--file_system_poll_wait_seconds={poll_seconds}",
        ]
    predictor: dict[str, Any] = {"serviceAccountName": service_account, "model": model}
    if node_selector:
        predictor["nodeSelector"] = node_selector
    if tolerations:
        predictor["tolerations"] = tolerations
    metadata: dict[str, Any] = {"name": name, "labels": {"app.kubernetes.io/name": "kfp-horovod"}}
    if namespace:
        metadata["namespace"] = namespace
    return {
        "apiVersion": INFERENCESERVICE.api_version,
        "kind": INFERENCESERVICE.kind,
        "metadata": metadata,
        "spec": {"predictor": predictor},
    }


def validate_inferenceservice(manifest: dict[str, Any], crd_path: str | None = None) -> None:
    """Raise `ManifestError` listing every way `manifest` does not match KServe's CRD."""
    raise_problems(
        manifest, INFERENCESERVICE, manifest_problems(manifest, INFERENCESERVICE, crd_path)
    )
