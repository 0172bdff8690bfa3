"""The offline CRD-schema check of the render commands: the vendored CRDs are found from the
project, each packaged copy equals its CRD, and the packaged copy is what validates where the
CRD is absent (the trainer image); and every rendered object checked against the CRDs of each
Kubeflow Trainer release vendored, unknown fields found as the API server's pruning
(`standins.kmock_api.prune`) would drop them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from components.common import crd as crds
from components.common import defaults
from components.common.crd import Crd
from components.train.launcher.cluster.job import job_kind
from components.train.launcher.cluster.mpijob import MPIJOB
from components.train.launcher.cluster.trainjob import TRAINING_RUNTIME, TRAINJOB
from pipeline.cli import cli
from standins.kmock_api import prune, schema_of, trainer_crds

ALL = [MPIJOB, TRAINJOB, TRAINING_RUNTIME]


@pytest.mark.parametrize("crd", ALL, ids=lambda c: c.kind)
def test_crd_is_found_from_the_project_and_a_missing_or_wrong_crd_is_named(
    crd: Crd, tmp_path: Path
) -> None:
    path = crds.find_crd(crd)
    assert path.name == crd.relative_path.name
    assert crds.load_schema(crd, str(path))["properties"]["spec"]["additionalProperties"] is False
    with pytest.raises(FileNotFoundError, match=crd.relative_path.name):
        crds.find_crd(crd, tmp_path)
    other = tmp_path / "crd.yaml"
    other.write_text(yaml.safe_dump({"kind": "ConfigMap", "spec": {"group": "x"}}))
    with pytest.raises(ValueError, match=f"not the {crd.group} {crd.kind} CRD"):
        crds.load_schema(crd, str(other))
    # a CRD of another kind in the same group (TrainingRuntime, TrainJob) is not this one's
    for sibling in (c for c in ALL if c.group == crd.group and c is not crd):
        with pytest.raises(ValueError, match=f"not the {crd.group} {crd.kind} CRD"):
            crds.crd_schema(crd, crds.find_crd(sibling))


@pytest.mark.parametrize("crd", ALL, ids=lambda c: c.kind)
def test_packaged_schema_equals_the_crd_and_validates_where_the_crd_is_absent(
    crd: Crd, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The trainer image has no deploy/crd/ folder and validates, strictly, with the packaged
    copy, which must not drift from the CRD (``make crd`` rewrites the copies)."""
    assert json.loads(crd.packaged_schema.read_text()) == crds.crd_schema(crd, crds.find_crd(crd))
    crds.load_schema.cache_clear()  # read anew, where the vendored CRD cannot be read
    monkeypatch.setattr(crds, "find_crd", lambda *_: pytest.fail("the vendored CRD was read"))
    assert crds.load_schema(crd)["properties"]["spec"]["additionalProperties"] is False


# --- every Kubeflow Trainer a current platform release ships (deploy/crd/trainer/<version>/)

TRAINERS = sorted(p.name for p in crds.find_crd(TRAINJOB).parents[1].glob("v*"))
SETTINGS = [  # the defaults, and a GPU run placed, scheduled and sized by hand
    [],
    [
        "--workers",
        "4",
        "--slots-per-worker",
        "2",
        "--gpus-per-worker",
        "2",
        "--node-selector",
        '{"cloud.google.com/gke-accelerator": "nvidia-l4"}',
        "--tolerations",
        '[{"key": "team", "operator": "Exists", "effect": "NoSchedule"}]',
        "--trainer-service-account",
        "trainer",
        "--priority-class",
        "batch",
        "--scheduler-name",
        "volcano",
        "--backoff-limit",
        "2",
        "--active-deadline-seconds",
        "600",
    ],
]


def test_the_vendored_trainers_are_those_platform_releases_ship() -> None:
    assert TRAINERS == ["v2.1.0", "v2.2.0", "v2.3.0"]
    assert defaults.TRAINER_VERSION in TRAINERS  # the one the backend is built against


@pytest.mark.parametrize("args", SETTINGS, ids=["defaults", "gpu-placed"])
@pytest.mark.parametrize("version", TRAINERS)
def test_each_rendered_object_is_valid_on_each_trainer_and_keeps_every_field_there(
    version: str, args: list[str]
) -> None:
    """``render-trainjob --crd-dir`` of a release: each object passes its CRD's schema (types,
    enums, required fields) and loses nothing to the API server's pruning; the TrainJob holds
    the deadline field only where the release has it (the train step enforces it elsewhere)."""
    folder = trainer_crds(version)
    result = CliRunner().invoke(cli, ["render-trainjob", "--crd-dir", str(folder), *args])
    assert result.exit_code == 0, result.output
    runtime, job = yaml.safe_load_all(result.stdout)
    for doc, crd in ((runtime, TRAINING_RUNTIME), (job, TRAINJOB)):
        path = str(folder / crd.relative_path.name)
        assert crds.manifest_problems(doc, crd, path) == [], (version, crd.kind)
        assert prune(doc, schema_of(crd, folder))[1] == [], (version, crd.kind)
    has_deadline = "activeDeadlineSeconds" in job["spec"]
    assert has_deadline == (version != "v2.1.0")
    note = "note: deadline: " in result.stderr and "enforced by the train step" in result.stderr
    assert note == (not has_deadline)


@pytest.mark.parametrize("version", TRAINERS)
def test_the_trainjob_written_for_v2_3_loses_only_its_deadline_on_an_older_trainer(
    version: str,
) -> None:
    """What the API server of each release would drop from the TrainJob as the project builds
    it (for v2.3.0): on v2.1.0 (Kubeflow 26.03), the deadline, which is why the train step
    reads the cluster's schema before it writes."""
    from components.train.tests.cluster_jobs import make_params

    runtime, job = job_kind("trainjob").build(make_params(), "team-a")
    folder = trainer_crds(version)
    dropped = ["spec.activeDeadlineSeconds"] if version == "v2.1.0" else []
    assert prune(job, schema_of(TRAINJOB, folder))[1] == dropped
    assert prune(runtime, schema_of(TRAINING_RUNTIME, folder))[1] == []


def test_the_rendered_mpijob_keeps_every_field_on_its_crd() -> None:
    result = CliRunner().invoke(cli, ["render-mpijob", *SETTINGS[1]])
    assert result.exit_code == 0, result.output
    (doc,) = yaml.safe_load_all(result.stdout)
    assert prune(doc, schema_of(MPIJOB))[1] == []


@pytest.mark.parametrize("command", ["render-mpijob", "render-trainjob"])
def test_a_crd_dir_without_the_crd_file_is_refused_in_one_line(
    command: str, tmp_path: Path
) -> None:
    result = CliRunner().invoke(cli, [command, "--crd-dir", str(tmp_path)])
    assert (result.exit_code, result.stdout) == (2, ""), result.output
    kind = job_kind(command.removeprefix("render-")).crd
    (line,) = result.stderr.splitlines()
    assert line == (
        f"FAILED: cannot read the {kind.kind} CRD {tmp_path / kind.relative_path.name}: "
        "No such file or directory"
    )
