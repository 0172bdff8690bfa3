"""deploy/rbac.yaml grants exactly what the cluster backends (MPIJob, TrainJob) use, in one
namespace."""

from __future__ import annotations

from pathlib import Path

import yaml

DEPLOY = Path(__file__).resolve().parents[3] / "deploy"


def test_rbac_is_least_privilege_and_namespaced() -> None:
    docs = list(yaml.safe_load_all((DEPLOY / "rbac.yaml").read_text()))
    assert sorted(d["kind"] for d in docs) == ["Role", "RoleBinding"]  # nothing cluster-wide
    role = next(d for d in docs if d["kind"] == "Role")
    binding = next(d for d in docs if d["kind"] == "RoleBinding")
    rules = {
        (group, resource): sorted(rule["verbs"])
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
    }
    assert rules == {
        ("kubeflow.org", "mpijobs"): ["create", "delete", "get", "list", "watch"],
        ("trainer.kubeflow.org", "trainjobs"): ["create", "delete", "get", "list", "watch"],
        ("trainer.kubeflow.org", "trainingruntimes"): ["create", "get"],
        ("", "pods"): ["get", "list"],
        ("", "pods/log"): ["get"],
    }
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": role["metadata"]["name"],
    }
    (subject,) = binding["subjects"]
    assert subject["kind"] == "ServiceAccount"
    assert role["metadata"]["namespace"] == binding["metadata"]["namespace"] == subject["namespace"]


def test_trainer_service_account_uses_workload_identity_not_keys() -> None:
    (sa,) = yaml.safe_load_all((DEPLOY / "trainer-serviceaccount.yaml").read_text())
    assert sa["kind"] == "ServiceAccount"
    assert sa["metadata"]["annotations"]["iam.gke.io/gcp-service-account"].endswith(
        ".iam.gserviceaccount.com"
    )
    text = "".join(p.read_text() for p in DEPLOY.glob("*.yaml"))
    assert "private_key" not in text and "GOOGLE_APPLICATION_CREDENTIALS" not in text
