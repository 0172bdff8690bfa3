"""One cluster job of the trainer, whichever operator runs it: its parameters
(`ClusterJobParams`), its name and labels, its errors, and the kinds of cluster job
(`ClusterJobKind`; `cluster.run.run_job` runs them all). Runs in the train step's pod and the
pipeline's CLI; nothing here imports ``kubernetes``, only `serves` and `choose_backend` ask a
cluster.
"""

from __future__ import annotations

import hashlib
import importlib
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from components.common import defaults, storage
from components.common.declare import Declared, Validated, declared, nonempty_problem, param
from components.common.failure import ExitCode, ExpectedError
from components.common.placement import Placement
from components.train.config import TrainConfig
from components.train.launcher.parameters import TrainStep
from components.train.rank.heartbeat import HEARTBEAT_ENV

if TYPE_CHECKING:
    from kubernetes.client import CustomObjectsApi

    from components.common.crd import Crd
    from components.train.launcher.cluster.schema import Schema

# Labels. KFP v2 itself labels task pods with ``pipeline/runid``; we reuse the key.
LABEL_RUN_ID = "pipeline/runid"
LABEL_RUN_NAME = "kfp-horovod/run-name"
LABEL_ROLE = "kfp-horovod/role"  # a pod's part in the job: launcher, worker, node
ANNOTATION_RUN_NAME = "kfp-horovod/run-name"
ANNOTATION_RUN_ID = "kfp-horovod/pipeline-run-id"
# A shared object's (the TrainingRuntime's) sha256 of the spec its name was made from.
SPEC_ANNOTATION = "kfp-horovod/runtime-spec-sha256"
APP_LABELS = {
    "app.kubernetes.io/name": "kfp-horovod",
    "app.kubernetes.io/component": "trainer",
    "app.kubernetes.io/managed-by": "kfp-horovod",
}
# The job's pods are named after it (mpi-operator: `<name>-launcher-xxxxx`, `<name>-worker-<i>`;
# JobSet: `<name>-launcher-0-0-xxxxx`, `<name>-node-0-<i>-xxxxx`), and a pod's hostname must be
# a DNS label (63 chars), so the job name leaves room for those suffixes.
MAX_NAME_LENGTH = 40
# What the job sets in its ranks' environment itself (`cluster.pods.launcher_env`, and Open MPI's
# OMPI_*), which the task config may not: unbuffered output, Horovod's stall bound, the heartbeat.
UNBUFFERED, STALL_BOUND = "PYTHONUNBUFFERED", "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS"
JOB_ENV = ("PATH", UNBUFFERED, STALL_BOUND, HEARTBEAT_ENV)


# Where the job's pods run, and what else they get from the train task, is one thing: the train
# task's ``dsl.TaskConfig`` (KFP >= 2.15, pipelines#12185), which reaches every pod that runs a rank
# as `PodConfig`. The pipeline's ``node_selector`` and ``tolerations`` parameters take that path too
# (the pipeline sets them on the train task with kfp-kubernetes), as do the render commands'
# options. The environment reaches the ranks (``mpirun -x``), so a name the job sets itself is
# refused (`JOB_ENV`).
@dataclass(frozen=True)
class PodConfig(Placement):
    """The task config's part that the job's rank pods get (empty: nothing set); making one
    checks its placement (`Placement`)."""

    affinity: dict[str, Any] = field(default_factory=dict)
    env: list[dict[str, Any]] = field(default_factory=list)
    volumes: list[dict[str, Any]] = field(default_factory=list)
    volume_mounts: list[dict[str, Any]] = field(default_factory=list)


@dataclass(frozen=True, kw_only=True)
class ClusterJobParams(Validated):
    """One cluster run of the trainer: what it trains, where and how its pods run, the run's name
    and KFP id, the task's pod (the job's owner) and what the train task's config passes through.
    The trainer's URIs must be ``gs://``: the job's pods cannot see the component's disk."""

    what = "cluster job parameters"

    train: TrainConfig
    step: TrainStep = field(default_factory=TrainStep)
    run_name: str = param(help="names the job", check=nonempty_problem)
    pipeline_run_id: str = param("", "the KFP run id (a label, and part of the name)")
    owner_pod_name: str | None = None
    task_config: PodConfig = field(default_factory=PodConfig)

    def part_problems(self) -> list[str]:
        """What only a cluster run refuses, across the parts (each checked its own fields)."""
        train, step = self.train, self.step
        problems = uri_problems(train.data, train.output, train.model_dir)
        if step.min_available is not None and step.min_available > train.workers + 1:
            problems.append(
                f"min_available must be <= workers + 1 launcher = {train.workers + 1}, "
                f"got {step.min_available}"
            )
        problems += [
            f"env {e.get('name')!r} from the train task's config: the job sets it itself"
            for e in self.task_config.env
            if e.get("name") in JOB_ENV or str(e.get("name", "")).startswith("OMPI_")
        ]
        return problems

    @property
    def image(self) -> str:
        """`step.trainer_image`, else this version's trainer image (GPU one if GPUs are asked)."""
        return defaults.trainer_image(self.train.gpus_per_worker, override=self.step.trainer_image)


CLUSTER_JOB_PARAMETERS: list[Declared] = declared(ClusterJobParams)


def uri_problems(data: str, output: str, model_dir: str | None) -> list[str]:
    """The trainer's URIs that are not ``gs://``: a cluster job's pods cannot see local disk."""
    return [
        f"{name} must be a gs:// URI for a cluster backend (its pods cannot see the "
        f"component's disk; a pipeline's root must be a gs:// bucket), got {uri!r}"
        for name, uri in (("data", data), ("output", output), ("model_dir", model_dir))
        if uri is not None and not storage.is_gcs(uri)
    ]


def sanitize_name(text: str, max_length: int = MAX_NAME_LENGTH) -> str:
    """Lower-case `text` into a DNS-1035 label; ``""`` when nothing usable is left."""
    slug = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")
    slug = re.sub(r"^[^a-z]+", "", slug)  # must start with a letter
    return slug[:max_length].rstrip("-")


def job_name(run_name: str, pipeline_run_id: str = "") -> str:
    """``hvd-<run name slug>-<hash>``, a DNS-1035 label of <= 40 chars: deterministic, so a
    retried KFP task finds the job its first attempt created; the hash keeps colliding slugs
    apart."""
    digest = hashlib.sha256(f"{pipeline_run_id}\0{run_name}".encode()).hexdigest()[:8]
    prefix = defaults.JOB_NAME_PREFIX
    slug = sanitize_name(run_name, MAX_NAME_LENGTH - len(prefix) - len(digest) - 2)
    return f"{prefix}-{slug}-{digest}" if slug else f"{prefix}-{digest}"


def label_value(text: str) -> str:
    """`text` made into a valid label value (<= 63 chars of [A-Za-z0-9_.-], alnum at the ends)."""
    value = re.sub(r"[^A-Za-z0-9_.-]+", "-", text)[:63]
    return re.sub(r"^[^A-Za-z0-9]+|[^A-Za-z0-9]+$", "", value)


def run_labels(p: ClusterJobParams) -> dict[str, str]:
    labels = {**APP_LABELS, LABEL_RUN_NAME: label_value(p.run_name) or "run"}
    if p.pipeline_run_id:
        labels[LABEL_RUN_ID] = label_value(p.pipeline_run_id)
    return labels


def job_metadata(p: ClusterJobParams, namespace: str | None) -> dict[str, object]:
    """The job's name, labels and annotations (`cluster.run` adds the owner reference)."""
    metadata: dict[str, object] = {
        "name": job_name(p.run_name, p.pipeline_run_id),
        "labels": run_labels(p),
        "annotations": {ANNOTATION_RUN_NAME: p.run_name, ANNOTATION_RUN_ID: p.pipeline_run_id},
    }
    if namespace:
        metadata["namespace"] = namespace
    return metadata


class ClusterJobError(ExpectedError):
    """A cluster job could not run, or succeeded without the expected outputs."""

    exit_code = ExitCode.RUN_FAILED


class ClusterJobFailed(ClusterJobError):
    """The job failed; carries the reason and the launcher log's last lines."""

    def __init__(self, what: str, reason: str, message: str, log_tail: list[str]) -> None:
        self.what, self.reason, self.message, self.log_tail = what, reason, message, log_tail
        tail = "\n".join(log_tail) if log_tail else "(no launcher log)"
        super().__init__(
            f"{what} failed: {reason}: {message}\n"
            f"--- last {len(log_tail)} lines of the launcher log ---\n{tail}"
        )


class ClusterJobCancelled(ClusterJobError):
    """The task was cancelled (SIGTERM; or Ctrl-C); the job was deleted. Exit 128 + N."""


@dataclass(frozen=True)
class ClusterJobState:
    """Pending (no condition yet), Created, Running, Restarting, Suspended, Succeeded or
    Failed, with the condition's reason and message."""

    phase: str
    reason: str = ""
    message: str = ""


@dataclass(frozen=True)
class ClusterJobKind:
    """One kind of cluster job (the MPIJob, the TrainJob), the one a cluster backend runs: what
    its operator serves and how its job looks on the API.

    `build` makes a run's manifests, the objects of the `shared` CRDs (shared by every run of
    the same settings) first, and raises ValueError naming what the backend cannot do;
    `problems` checks what the CRD cannot say; `terminal` maps terminal condition types to
    Failed or Succeeded; the job's pods carry ``pod_label: <job name>``, its launcher pod
    `launcher_label` too; `refused` names the train step's parameters it cannot take (set
    otherwise than their default), and why. The job's own deadline is at `deadline` in its
    manifest, a field its CRD has had since `deadline_since`.
    """

    name: str
    crd: Crd
    shared: tuple[Crd, ...]
    build: Callable[[ClusterJobParams, str | None], list[dict[str, Any]]]
    problems: Callable[[dict[str, Any]], list[str]]
    terminal: Mapping[str, str]
    pod_label: str
    launcher_label: tuple[str, str]
    launcher_container: str
    install: str
    deadline: tuple[str, ...]
    deadline_since: str
    refused: Mapping[str, str] = field(default_factory=dict)

    def what(self, namespace: str, name: str) -> str:
        """``<Kind> <namespace>/<name>``, as every message names the job."""
        return f"{self.crd.kind} {namespace}/{name}"

    def state(self, job: Mapping[str, Any]) -> ClusterJobState:
        """From the true ``status.conditions``: a terminal one (Failed first), else the newest
        by ``lastTransitionTime`` (the later listed on a tie). With none, from
        ``status.jobsStatus`` (Trainer sets no condition while a TrainJob runs, only the
        JobSet's counts): Running while a child job has an active pod, else Pending."""
        status = job.get("status") or {}
        conditions = [c for c in status.get("conditions") or [] if c.get("status") == "True"]
        by_type = {c.get("type"): c for c in conditions}
        failed_first = sorted(self.terminal.items(), key=lambda kp: kp[1] != "Failed")
        ends = [(phase, by_type[kind]) for kind, phase in failed_first if kind in by_type]
        if conditions:
            newest = max(reversed(conditions), key=lambda c: c.get("lastTransitionTime") or "")
            phase, c = ends[0] if ends else (newest.get("type", "Unknown"), newest)
            return ClusterJobState(phase, c.get("reason", ""), c.get("message", ""))
        jobs = status.get("jobsStatus") or []
        if not any(j.get("active") for j in jobs):
            return ClusterJobState("Pending")
        counts = ", ".join(
            f"{j.get('name')}: {j.get('ready') or 0} ready of {j.get('active') or 0} active"
            for j in jobs
        )
        return ClusterJobState("Running", "", counts)


def job_kind(name: str) -> ClusterJobKind:
    """The kind of job that backend `name` (``mpijob``, ``trainjob``) runs:
    ``cluster/<name>.py``'s ``JOB_KIND``."""
    return importlib.import_module(f"components.train.launcher.cluster.{name}").JOB_KIND  # type: ignore[no-any-return]


def check_manifests(
    b: ClusterJobKind, manifests: list[dict[str, Any]], crd_dir: str | None = None
) -> None:
    """`ManifestError` naming every field of `manifests` that their CRDs (vendored, or of the
    same names in `crd_dir`) or `b.problems` refuse."""
    from components.common.crd import manifest_problems, raise_problems

    for manifest, crd in zip(manifests, (*b.shared, b.crd), strict=True):
        path = str(Path(crd_dir) / crd.relative_path.name) if crd_dir else None
        raise_problems(manifest, crd, manifest_problems(manifest, crd, path) + b.problems(manifest))


# Who enforces a job's deadline: the cluster (the job's own deadline field, which its operator
# enforces) or the train step (it deletes the job when the deadline passes).
BY_CLUSTER, BY_STEP = "cluster", "step"


@dataclass(frozen=True)
class Deadline:
    """The job's deadline (`seconds`, ``active_deadline_seconds``), who enforces it and why."""

    seconds: int
    by: str
    why: str

    def said(self, grace_s: float) -> str:
        """The deadline in one line, for the step's log."""
        if self.by == BY_STEP:
            return (
                f"deadline: {self.seconds} s (active_deadline_seconds), enforced by the train step "
                f"({self.why}): it deletes the job when the deadline passes"
            )
        return (
            f"deadline: {self.seconds} s (active_deadline_seconds), enforced by the cluster "
            f"({self.why}); the train step deletes the job {grace_s:g} s after it, if it runs on"
        )

    def exceeded(self, phase: str, grace_s: float) -> str:
        """Why the train step deleted a job still in `phase` (one line, naming the deadline)."""
        if self.by == BY_STEP:
            return (
                f"still {phase} when its {self.seconds} s deadline (active_deadline_seconds) "
                f"passed, which the train step enforces ({self.why}); the job was deleted"
            )
        return (
            f"still {phase} {grace_s:g} s after its {self.seconds} s deadline "
            f"(active_deadline_seconds), which the cluster did not enforce; the job was deleted"
        )


def fit_deadline(
    b: ClusterJobKind, job: dict[str, Any], seconds: int, schema: Schema | None
) -> Deadline:
    """Who enforces `job`'s deadline of `seconds`, for `schema` (the job's, as the cluster
    serves it; None: not known): where it lacks the deadline field, the field is taken out of
    `job` and the train step enforces the deadline."""
    path, what = b.deadline, ".".join(b.deadline)
    if schema is None or schema.has(path):
        return Deadline(seconds, BY_CLUSTER, f"the {b.crd.kind}'s {what}")
    parent = job
    for key in path[:-1]:
        parent = parent[key]
    del parent[path[-1]]
    why = f"this cluster's {b.crd.kind} has no {what}, which {b.deadline_since} added"
    return Deadline(seconds, BY_STEP, why)


def validated(
    b: ClusterJobKind, p: ClusterJobParams, namespace: str | None = None, crd_dir: str | None = None
) -> tuple[list[dict[str, Any]], Deadline]:
    """`b`'s manifests for `p`, fitted to the job's CRD (of the same name in `crd_dir`, else
    the packaged one) and checked against the CRDs offline (`check_manifests`), and who
    enforces the deadline."""
    from components.common.crd import load_schema
    from components.train.launcher.cluster.schema import Schema

    path = str(Path(crd_dir) / b.crd.relative_path.name) if crd_dir else None
    manifests = b.build(p, namespace)
    schema = Schema(load_schema(b.crd, path))
    deadline = fit_deadline(b, manifests[-1], p.step.active_deadline_seconds, schema)
    check_manifests(b, manifests, crd_dir)
    return manifests, deadline


def serves(api: CustomObjectsApi, crd: Crd) -> bool:
    """Whether the cluster serves `crd`'s resource (from discovery, which any user may read)."""
    from kubernetes.client.exceptions import ApiException

    try:
        found = api.get_api_resources(crd.group, crd.version)
    except ApiException as exc:
        if exc.status != 404:
            raise
        return False
    return crd.plural in {r.name for r in found.resources or []}


@dataclass(frozen=True)
class Choice:
    """The backend a run used and why (for the run summary and the coordination report)."""

    backend: str
    reason: str


def choose_backend(api: CustomObjectsApi) -> Choice:
    """The backend for ``training_backend=auto``: the MPIJob where the cluster serves it (the
    stable API, which runs elastic jobs), else the TrainJob; `ClusterJobError` when it serves
    neither."""
    kinds = {name: job_kind(name).crd for name in ("mpijob", "trainjob")}
    api_of = {name: f"{crd.kind} {crd.api_version}" for name, crd in kinds.items()}
    mpijob, trainjob = api_of.values()
    served = [name for name, crd in kinds.items() if serves(api, crd)]
    if not served:
        raise ClusterJobError(
            f"training_backend=auto: this cluster serves neither {mpijob} nor {trainjob}: "
            f"install mpi-operator {defaults.MPI_OPERATOR_VERSION} (it also runs elastic jobs) "
            f"or Kubeflow Trainer {defaults.TRAINER_VERSION.rsplit('.', 1)[0]} "
            "(docs/cluster.md); nothing was created"
        )
    if len(served) == 2:
        return Choice(
            "mpijob",
            f"this cluster serves both {mpijob} (mpi-operator) and {trainjob} "
            "(Kubeflow Trainer); the MPIJob is the stable API and runs elastic jobs",
        )
    (name,) = served
    other = trainjob if name == "mpijob" else mpijob
    return Choice(name, f"this cluster serves {api_of[name]} and not {other}")
