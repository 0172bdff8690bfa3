"""deploy/rbac.yaml against the requests the cluster backends (MPIJob, TrainJob) make: each
backend runs through the real kubernetes client on kmock (`standins.kmock_cluster`), every
request it sent is read back from kmock's record as the right it needs, and the Role must grant
each of them, in one namespace, and nothing the backends leave unused but reading what they
use."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

DEPLOY = Path(__file__).resolve().parents[3] / "deploy"


def test_rbac_is_one_namespaced_role_bound_to_one_service_account() -> None:
    docs = list(yaml.safe_load_all((DEPLOY / "rbac.yaml").read_text()))
    assert sorted(d["kind"] for d in docs) == ["Role", "RoleBinding"]  # nothing cluster-wide
    role = next(d for d in docs if d["kind"] == "Role")
    binding = next(d for d in docs if d["kind"] == "RoleBinding")
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


STEP = "kfp-horovod-train-step"  # the user agent of the train step's requests
Right = tuple[str, str, str]


def _sent(cluster: Any) -> set[Right | None]:
    """The rights the train step's requests recorded by kmock need (None: discovery); the
    stand-in's own requests, which the operator makes on a real cluster, are told apart by
    their user agent."""
    return {
        _right(r.method.value, r.url.path, r.params)
        for r in list(cluster.emu)
        if {k.lower(): v for k, v in r.headers.items()}.get("user-agent") == STEP
    }


def _run(backend: str, gcs_uri: str) -> set[Right]:
    """The rights backend `backend`'s run needs: a run that owns its job (it reads its task
    pod), replaces a failed earlier attempt (a create refused 409, a delete, a create), makes
    or reuses the shared TrainingRuntime, reads the served schema, and follows the new job to
    success while it streams the launcher's log."""
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
        task.user_agent = STEP
        run_job(b, p, namespace=NS, api_client=task, poll_interval_s=POLL, log=lambda _: None)
        op.join()
        sent = _sent(cluster)
    return {right for right in sent if right is not None}


def _auto(gcs_uri: str) -> set[Right | None]:
    """The rights ``training_backend=auto``'s choice needs (the step asks before any run)."""
    from kubernetes import client

    from components.train.launcher.cluster.job import choose_backend
    from standins.kmock_cluster import Cluster

    with Cluster() as cluster:
        task = client.ApiClient(cluster.api.configuration)
        task.user_agent = STEP
        assert choose_backend(client.CustomObjectsApi(task)).backend == "mpijob"
        return _sent(cluster)


@pytest.mark.timeout(60)
def test_the_role_grants_every_request_of_each_backend_and_nothing_they_leave_unused(
    gcs_uri: str,
) -> None:
    from components.train.launcher.cluster.job import job_kind

    granted = _granted()
    used = {name: _run(name, gcs_uri) for name in ("mpijob", "trainjob")}
    for name, rights in used.items():
        assert rights <= granted, (name, sorted(rights - granted))
        b = job_kind(name)  # the run went where the check must look: its job, its shared kinds
        for crd in (b.crd, *b.shared):
            assert {(crd.group, crd.plural, "create"), (crd.group, crd.plural, "get")} <= rights
        assert {(b.crd.group, b.crd.plural, "delete"), ("", "pods/log", "get")} <= rights
    assert _auto(gcs_uri) == {None}  # API discovery only: every authenticated user may read it
    either = set().union(*used.values())
    unused = granted - either
    # no resource the backends never touch, no write they never make: at most reading more of
    # what they use (list and watch of the jobs, which `kubectl get <jobs> -l` needs: the
    # doc's commands that follow a run, tests/test_docs_cluster.py)
    assert {(g, r) for g, r, _ in granted} == {(g, r) for g, r, _ in either}, sorted(unused)
    assert {verb for _, _, verb in unused} <= {"get", "list", "watch"}, sorted(unused)
