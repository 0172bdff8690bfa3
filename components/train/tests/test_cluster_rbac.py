"""deploy/rbac.yaml grants exactly what the cluster backends (MPIJob, TrainJob) use, in one
namespace."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

DEPLOY = Path(__file__).resolve().parents[3] / "deploy"


def test_rbac_is_least_privilege_and_namespaced() -> None:
    docs = list(yaml.safe_load_all((DEPLOY / "rbac.yaml").read_text()))
    assert sorted(d["kind"] for d in docs) == ["Role", "RoleBinding"]  # nothing cluster-wide
    role = next(d for d in docs if d["kind"] == "Role")
    binding = next(d for d in docs if d["kind"] == "RoleBinding")
    expected = {
        ("kubeflow.org", "mpijobs"): "create delete get list watch",
        ("trainer.kubeflow.org", "trainjobs"): "create delete get list watch",
        ("trainer.kubeflow.org", "trainingruntimes"): "create get",
        ("", "pods"): "get list",
        ("", "pods/log"): "get",
    }
    assert _granted() == {(g, r, v) for (g, r), verbs in expected.items() for v in verbs.split()}
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


def _granted() -> set[tuple[str, str, str]]:
    """``(apiGroup, resource, verb)`` of every right the Role grants."""
    docs = yaml.safe_load_all((DEPLOY / "rbac.yaml").read_text())
    role = next(d for d in docs if d["kind"] == "Role")
    return {
        (group, resource, verb)
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


_VERBS = {"POST": "create", "DELETE": "delete", "PATCH": "patch", "PUT": "update"}


def _right(method: str, path: str, params: Any) -> tuple[str, str, str] | None:
    """The ``(apiGroup, resource, verb)`` a request needs; None for API discovery and the
    OpenAPI documents (granted to every authenticated user by the cluster's system:discovery
    role: /api, /apis and /openapi with what is below them)."""
    parts = path.strip("/").split("/")
    if parts[0] == "openapi":
        return None
    if parts[0] == "api":
        group, rest = "", parts[2:]
    else:
        group, rest = parts[1], parts[3:]
    if not rest:
        return None  # /api, /apis, /apis/<group>, /apis/<group>/<version>
    assert rest[0] == "namespaces", f"a cluster-wide request: {method} {path}"
    resource, named = rest[2], len(rest) > 3
    if len(rest) > 4:
        resource = f"{resource}/{rest[4]}"
    verb = _VERBS.get(method) or ("get" if named else "watch" if "watch" in params else "list")
    return group, resource, verb


@pytest.mark.timeout(60)
@pytest.mark.parametrize("backend", ["mpijob", "trainjob"])
def test_each_backend_sends_only_requests_the_role_grants(backend: str, gcs_uri: str) -> None:
    """The train step's requests, recorded by kmock for a run that owns its job, replaces a
    failed earlier attempt (delete, create) and follows the new one to success, read back as
    the rights they need: every one is in deploy/rbac.yaml (the stand-in's own requests,
    which the operator makes on a real cluster, are told apart by their user agent)."""
    from kubernetes import client

    from components.train.launcher.cluster.run import run_job
    from components.train.tests.cluster_jobs import POLL, make_params, pair
    from standins.kmock_cluster import NS, Cluster, Operator, pod
    from standins.waiting import wait_until

    b, kind = pair(backend)
    p = make_params(gcs_uri, owner_pod_name="task-pod")
    earlier = b.build(p, NS)[-1]
    crd, name = kind.crd, earlier["metadata"]["name"]
    with Cluster() as cluster:
        cluster.core.create_namespaced_pod(NS, pod("task-pod", {}, uid="uid-1"))
        cluster.custom.create_namespaced_custom_object(
            crd.group, crd.version, NS, crd.plural, earlier
        )
        Operator(cluster, kind).finish(name, 1)

        def script(op: Operator) -> None:
            wait_until(
                lambda: len(cluster.requests("POST", f"/{crd.plural}")) >= 3,
                "the run's third create (ours, a 409, the new one)",
            )
            pod_name = op.start(name)
            op.say(pod_name, "[1,0]<stdout>:[rank 0/4] done")
            op.write_outputs(name)
            op.finish(name, 0)

        op = Operator(cluster, kind)
        op.play(script)
        task = client.ApiClient(cluster.api.configuration)
        task.user_agent = "kfp-horovod-train-step"
        run_job(b, p, namespace=NS, api_client=task, poll_interval_s=POLL, log=lambda _: None)
        op.join()
        sent = {
            _right(r.method.value, r.url.path, r.params)
            for r in list(cluster.emu)
            if dict((k.lower(), v) for k, v in r.headers.items()).get("user-agent")
            == "kfp-horovod-train-step"
        } - {None}
    assert sent <= _granted(), sorted(sent - _granted())
    group = crd.group
    assert {
        (group, crd.plural, "create"),
        (group, crd.plural, "delete"),
        ("", "pods", "get"),
        ("", "pods/log", "get"),
    } <= sent, sorted(sent)
    if backend == "trainjob":
        assert ("trainer.kubeflow.org", "trainingruntimes", "create") in sent
