"""Every command and manifest of docs/cluster.md, checked against the repository: each
``render-*`` command run (its output valid against the vendored CRDs, its placement on every
pod; ``render-inferenceservice`` against a registry on fake-gcs-server); each ``submit --param``
a pipeline parameter its rule accepts; each YAML manifest against a vendored CRD or
deploy/rbac.yaml as the doc's ``sed`` rewrites it; each ``kubectl`` command that follows a run
asks for what deploy/rbac.yaml grants (those that install operators or need a live cluster
cannot run here); each file it names exists; the versions it names are the project's.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from components.common import defaults
from components.train.tests.cluster_jobs import pod_specs
from pipeline.checks import parse_arguments
from pipeline.cli import cli

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "cluster.md"
TEXT = DOC.read_text()
# The shell variables the doc's commands use, as a reader would set them (its section 3).
SHELL = {"BUCKET": "my-kfp-horovod", "PROJECT_ID": "my-project"}
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)


def fenced(language: str) -> list[str]:
    return [body for lang, body in FENCE.findall(TEXT) if lang == language]


def shell_commands() -> list[str]:
    """Every command of the doc's ``sh`` blocks, continuation lines joined, ``$VAR``s set."""
    commands = []
    for block in fenced("sh"):
        for line in block.replace("\\\n", " ").splitlines():
            line = re.sub(r"\$(\w+)", lambda m: SHELL.get(m[1], m[0]), line).strip()
            if line and not line.startswith("#"):
                commands.append(line)
    return commands


def pipeline_commands(name: str) -> list[list[str]]:
    """The arguments after ``python -m pipeline`` of each `name` command, up to a pipe."""
    found = []
    for command in shell_commands():
        words = shlex.split(command.split(" | ")[0], comments=True)
        if words[:4] == ["python", "-m", "pipeline", name]:
            found.append(words[3:])
    return found


RENDERS = pipeline_commands("render-mpijob") + pipeline_commands("render-trainjob")
(ROLE,) = [d for d in yaml.safe_load_all((ROOT / "deploy/rbac.yaml").read_text())
           if d["kind"] == "Role"]  # fmt: skip


def _flag(args: list[str], flag: str) -> str | None:
    return args[args.index(flag) + 1] if flag in args else None


def crd_problems(doc: dict[str, Any]) -> list[str]:
    """`doc` checked against its kind's vendored CRD (strictly: unknown fields too)."""
    from components.common.crd import manifest_problems
    from components.train.launcher.cluster.job import job_kind

    for b in (job_kind("mpijob"), job_kind("trainjob")):
        for crd in (b.crd, *b.shared):
            if doc.get("kind") == crd.kind:
                path = str(ROOT / crd.relative_path)
                return manifest_problems(doc, crd, path) + b.problems(doc)
    return [f"kind {doc.get('kind')!r} has no vendored CRD"]


def test_the_doc_has_render_commands_of_both_backends_and_the_gke_placements() -> None:
    names = [args[0] for args in RENDERS]
    assert {"render-mpijob", "render-trainjob"} <= set(names)
    selectors = " ".join(_flag(args, "--node-selector") or "" for args in RENDERS)
    for label in ("cloud.google.com/gke-accelerator", "cloud.google.com/gke-spot", "team"):
        assert f'"{label}"' in selectors, label


@pytest.mark.parametrize("args", RENDERS, ids=[f"{a[0]}:{_flag(a, '--run-name')}" for a in RENDERS])
def test_each_render_command_prints_manifests_valid_against_the_vendored_crds(
    args: list[str],
) -> None:
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    docs = list(yaml.safe_load_all(result.output))
    expected_kinds = {
        "render-mpijob": ["MPIJob"],
        "render-trainjob": ["TrainingRuntime", "TrainJob"],
    }
    assert [d["kind"] for d in docs] == expected_kinds[args[0]]
    for doc in docs:
        assert crd_problems(doc) == [], doc["kind"]
    selector = json.loads(_flag(args, "--node-selector") or "{}")
    tolerations = json.loads(_flag(args, "--tolerations") or "[]")
    specs = [spec for doc in docs for spec in pod_specs(doc)]
    assert specs
    for spec in specs:  # every pod of the job: the launcher, the workers, every node
        assert selector.items() <= spec.get("nodeSelector", {}).items(), spec
        for toleration in tolerations:
            assert spec.get("tolerations", []).count(toleration) == 1, spec


def test_each_submit_parameter_is_a_pipeline_parameter_its_rule_accepts() -> None:
    submits = pipeline_commands("submit")
    assert submits
    for args in submits:
        pairs = [v for k, v in zip(args, args[1:], strict=False) if k == "--param"]
        assert pairs
        parse_arguments(pairs)  # as submit reads them: an unknown name or a bad value raises


def _sed_rbac() -> list[dict[str, Any]]:
    """deploy/rbac.yaml as the doc's ``sed … deploy/rbac.yaml | kubectl apply`` rewrites it."""
    (command,) = [c for c in shell_commands() if c.startswith("sed ") and "deploy/rbac.yaml" in c]
    words = shlex.split(command.split(" | ")[0])
    out = subprocess.run(words, cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return list(yaml.safe_load_all(out))


def test_the_multi_user_rbac_is_deploy_rbac_in_the_profiles_namespace_for_default_editor() -> None:
    role, binding = sorted(_sed_rbac(), key=lambda d: d["kind"])  # Role, RoleBinding
    assert role["rules"] == ROLE["rules"]
    (subject,) = binding["subjects"]
    assert subject["name"] == "default-editor"
    assert role["metadata"]["namespace"] == binding["metadata"]["namespace"] == subject["namespace"]
    assert role["metadata"]["namespace"] != "kubeflow"


def test_each_yaml_manifest_is_checked_against_a_vendored_crd_or_deploy_rbac() -> None:
    manifests = [doc for block in fenced("yaml") for doc in yaml.safe_load_all(block)]
    assert manifests
    rbac = {(d["kind"], d["metadata"]["name"]): d for d in _sed_rbac()}
    for doc in manifests:
        if doc["apiVersion"].startswith("rbac.authorization.k8s.io/"):
            assert doc == rbac[(doc["kind"], doc["metadata"]["name"])]
        else:
            assert crd_problems(doc) == []


def test_kubectl_commands_that_follow_a_run_ask_for_what_deploy_rbac_grants() -> None:
    rights = {(r, v) for rule in ROLE["rules"] for r in rule["resources"] for v in rule["verbs"]}
    inline = re.findall(r"`(kubectl [^`]+)`", TEXT)
    checked = 0
    for command in [c for c in shell_commands() if c.startswith("kubectl ")] + inline:
        words = shlex.split(command.split(" | ")[0], comments=True)
        for flag in ("-f", "-k"):  # a file of this repository must exist
            target = _flag(words, flag)
            if target and target != "-" and "://" not in target and "github.com" not in target:
                assert (ROOT / target).exists(), words
        if _flag(words, "-n") != ROLE["metadata"]["namespace"] or len(words) < 4:
            continue
        verb, what = words[3], words[4] if len(words) > 4 else ""
        if verb == "get" and what in {r for r, _ in rights}:
            assert {(what, "get"), (what, "list")} <= rights, words
            checked += 1
        elif verb == "logs":
            assert ("pods/log", "get") in rights and ("pods", "list") in rights, words
            checked += 1
    assert checked >= 3  # mpijobs, trainjobs, the launcher's log


def test_the_doc_is_final_and_names_only_paths_of_this_repository() -> None:
    assert "(draft)" not in TEXT and "shared/" not in TEXT
    top = r"(?<![\w/.-])((?:deploy|components|docs|requirements|pipeline)/"
    paths = re.findall(top + r"[\w./-]*(?:\.(?:yaml|md|txt|py|json)|/))", TEXT)
    links = re.findall(r"\]\((?:\.\./)?([^)#:]+?)(?:#[^)]*)?\)", TEXT)
    assert paths and links
    for path in paths:
        assert (ROOT / path).exists(), path
    for link in links:
        assert (DOC.parent / link).exists() or (ROOT / link).exists(), link


def _versions_table() -> dict[str, dict[str, str]]:
    """Section 1a's table of versions: each component's row, by column header."""
    lines = TEXT.splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith("| component |"))
    rows = []
    for line in lines[first:]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip("|").split("|")])
    header = rows[0]
    assert header[-1] == "this project", header
    return {cells[0]: dict(zip(header, cells, strict=True)) for cells in rows[2:]}


def _exported(variable: str) -> str:
    (value,) = {v for c in shell_commands() for v in re.findall(rf"^export {variable}=(\S+)$", c)}
    return value


VERSION = re.compile(r"v\d+\.\d+\.\d+")


def test_the_versions_it_names_are_the_code_s() -> None:
    """The versions the doc tells a reader to install are the ones the code builds against
    (components/common/defaults.py) and the CRDs it vendors (deploy/crd/), and the SDK the
    lock installs."""
    lock = (ROOT / "requirements/lock.txt").read_text()
    (kfp,) = re.findall(r"^kfp==(\S+)$", lock, re.M)
    assert set(re.findall(r"(?:KFP SDK|the SDK is) (\d+\.\d+\.\d+)", TEXT)) == {kfp}
    assert _exported("TRAINER_VERSION") == defaults.TRAINER_VERSION
    assert _exported("MPI_OPERATOR_VERSION") == defaults.MPI_OPERATOR_VERSION
    table = _versions_table()
    assert VERSION.findall(table["mpi-operator"]["this project"]) == [defaults.MPI_OPERATOR_VERSION]
    # the Trainers the doc says the TrainJob backend runs on: the ones vendored and tested
    vendored = sorted(d.name for d in (ROOT / "deploy/crd/trainer").iterdir() if d.is_dir())
    assert sorted(set(VERSION.findall(table["Kubeflow Trainer"]["this project"]))) == vendored
    assert f"### 2b. Kubeflow Trainer {vendored[0]} to {vendored[-1]} " in TEXT
    assert vendored[-1] == defaults.TRAINER_VERSION  # built against the newest
    # every Trainer a platform release installs is one of them
    releases = [column for column in table["Kubeflow Trainer"] if re.fullmatch(r"[\d.]+", column)]
    assert releases
    for release in releases:
        assert VERSION.findall(table["Kubeflow Trainer"][release])[0] in vendored, release
    (kserve_tag,) = re.findall(
        r"at tag `(v[\d.]+)`", (ROOT / "deploy/crd/kserve/SOURCE.md").read_text()
    )
    assert re.findall(r"the vendored CRD,\s+`deploy/crd/kserve/`, is (v[\d.]+)'s", TEXT) == [
        kserve_tag
    ]


def test_the_platform_release_it_installs_is_the_one_it_describes() -> None:
    """The release section 1a clones is the newest the table describes, and the KFP standalone
    install (1b) is that release's Kubeflow Pipelines."""
    table = _versions_table()
    releases = [column for column in table["Kubeflow Pipelines"] if re.fullmatch(r"[\d.]+", column)]
    newest = max(releases, key=lambda r: tuple(map(int, r.split("."))))
    (branch,) = re.findall(r"git clone --branch (\S+) https://github.com/kubeflow/manifests", TEXT)
    assert branch == newest
    assert f"release **{newest}**" in TEXT
    assert _exported("PIPELINE_VERSION") == table["Kubeflow Pipelines"][newest]
    platform_trainer = VERSION.findall(table["Kubeflow Trainer"][newest])[:1]
    assert re.findall(rf"{re.escape(newest)} has\s+\*\*(v[\d.]+)\*\*", TEXT) == platform_trainer


def test_the_sdk_example_places_the_train_task_through_kfp_kubernetes(tmp_path: Path) -> None:
    """The Python example's kfp-kubernetes calls, applied to the real train task, compile into
    its platform config (the task config the train step forwards)."""
    from kfp import compiler, dsl

    from components.train.config import TrainConfig
    from components.train.launcher.parameters import TrainStep
    from components.train.step.component import make_component

    (example,) = [block for block in fenced("python") if "kubernetes." in block]
    calls = "\n".join(
        line for line in example.splitlines() if line.startswith(("kubernetes.", "train."))
    )
    train_op = make_component("trainer:test")
    step_defaults = {
        p.name: p.default
        for p in (
            *TrainConfig.parameters(pipeline_only=True),
            *TrainStep.parameters(pipeline_only=True),
        )
    }

    def placed(dataset_uri: str = "gs://b/d") -> None:
        data = dsl.importer(artifact_uri=dataset_uri, artifact_class=dsl.Dataset)
        train = train_op(dataset=data.output, pipeline_run_id="x", **step_defaults)
        from kfp import kubernetes

        exec(calls, {"kubernetes": kubernetes, "train": train})

    placed.__annotations__ = {"dataset_uri": str, "return": None}  # not strings (PEP 563)
    path = tmp_path / "p.yaml"
    compiler.Compiler().compile(dsl.pipeline(name="placed")(placed), str(path))
    platforms = list(yaml.safe_load_all(path.read_text()))[1]["platforms"]
    executors = platforms["kubernetes"]["deploymentSpec"]["executors"]
    (config,) = executors.values()
    assert config["nodeSelector"]["labels"] == {"cloud.google.com/gke-accelerator": "nvidia-l4"}
    assert config["tolerations"] == [
        {"key": "team", "operator": "Equal", "value": "ml", "effect": "NoSchedule"}
    ]


def test_the_inferenceservice_command_serves_the_aliass_serving_folder(gcs_uri: str) -> None:
    """Section 7's render-inferenceservice, run against a registry (on fake-gcs-server) whose
    production alias exists: a CRD-valid InferenceService of the alias's serving folder."""
    from components.common.crd import manifest_problems
    from components.register.registry import ModelStore, challenger_wins
    from components.serve.inferenceservice import INFERENCESERVICE

    (args,) = pipeline_commands("render-inferenceservice")
    root = f"{gcs_uri}/models"
    args[args.index("--registry-root") + 1] = root
    record = {"version": 1, "metrics": {"accuracy": 0.98, "loss": 0.1}}
    assert ModelStore(root, "mnist-cnn").move_alias_if("production", record, challenger_wins)[0]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    (doc,) = yaml.safe_load_all(result.stdout)
    assert (
        manifest_problems(doc, INFERENCESERVICE, str(ROOT / INFERENCESERVICE.relative_path)) == []
    )
    predictor = doc["spec"]["predictor"]
    assert predictor["model"]["storageUri"] == f"{root}/mnist-cnn/_serving/production"
    assert doc["metadata"]["namespace"] == "kubeflow"
