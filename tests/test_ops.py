"""``python -m pipeline upload | submit | schedule | version-name``: the real kfp.Client over
real HTTP to tests/kfp_standin.py, which stands in for the KFP API server (it needs a cluster).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import kfp
import pytest
from click.testing import CliRunner

from components.common.failure import ExitCode
from pipeline import ops
from pipeline.build import compile_pipeline
from pipeline.checks import parse_arguments
from pipeline.cli import cli
from standins.waiting import HANG_S
from tests.kfp_standin import KfpStandin

ROOT = Path(__file__).resolve().parents[1]
NAME = "kfp-horovod-mnist"
REGISTRY = "registry_root=gs://b/models"  # every run needs one (the check step's rule)
TRAIN_FAILED = "failed task(s): train: horovodrun exited with 1"  # the leaf, not its DAG
FAILED_TASKS = [
    {"task_id": "t0", "display_name": "root", "state": "FAILED",
     "child_tasks": [{"task_id": "t2"}]},
    {"task_id": "t1", "display_name": "prepare-data", "state": "SUCCEEDED"},
    {"task_id": "t2", "display_name": "train", "state": "FAILED",
     "error": {"message": "horovodrun exited with 1"}},
]  # fmt: skip


@pytest.fixture(autouse=True)
def _no_kfp_settings(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in [n for n in os.environ if n.startswith("KF_PIPELINES_")]:
        monkeypatch.delenv(name)
    monkeypatch.setattr(kfp.Client, "_LOCAL_KFP_CONTEXT", str(tmp_path / "kfp-context.json"))


@pytest.fixture(scope="module")
def package(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return compile_pipeline(tmp_path_factory.mktemp("pkg") / "pipeline.yaml")


@pytest.fixture
def standin() -> Any:
    with KfpStandin() as server:
        yield server


def invoke(standin: KfpStandin, *args: str, **env: str) -> Any:
    env = {"KF_PIPELINES_ENDPOINT": standin.url, **env}
    return CliRunner().invoke(cli, list(args), env=env, catch_exceptions=False)


def test_arguments_are_typed_by_their_declarations() -> None:
    pairs = ["workers=3", "learning_rate=1e-3", "augment=yes", "model=small", "node_selector={}",
             "data_source=https://h/m.npz?a=b"]  # fmt: skip
    assert parse_arguments([REGISTRY, *pairs]) == {
        "registry_root": "gs://b/models", "workers": 3, "learning_rate": 0.001, "augment": True,
        "model": "small", "node_selector": {}, "data_source": "https://h/m.npz?a=b",
    }  # fmt: skip


@pytest.mark.parametrize(
    ("pairs", "message"),
    [
        (["epochs=three"], "parameter 'epochs': 'three' is not a valid integer"),
        (["learning_rate=fast"], "parameter 'learning_rate': 'fast' is not a valid float"),
        (["augment=maybe"], "parameter 'augment': 'maybe' is not a valid boolean"),
        (["epoch=2"], "unknown pipeline parameter 'epoch'; the pipeline declares: workers, "),
        (["workers"], "bad parameter 'workers': expected NAME=VALUE"),
        (["=3"], "bad parameter '=3': expected NAME=VALUE"),
        (["epochs=1", "epochs=2"], "parameter 'epochs' is given more than once"),
        (["workers=0"], "invalid pipeline parameters: workers must be >= 1, got 0"),
        (["min_workers=3"], "invalid pipeline parameters: min_workers must be <= workers"),
        (["model=resnet"], "invalid pipeline parameters: model must be one of the built-in"),
        (["node_selector={pool: a}"], "node_selector is not JSON (Expecting property name"),
        (["tolerations={}"], "invalid pipeline parameters: tolerations must be a JSON list"),
    ],
)
def test_bad_arguments_are_refused_naming_them(pairs: list[str], message: str) -> None:
    with pytest.raises(ValueError) as info:
        parse_arguments([REGISTRY, *pairs])
    assert str(info.value).startswith(message)


def test_a_run_without_a_registry_is_refused_as_the_check_step_would() -> None:
    """The one required parameter, missing (KFP refuses the run) or empty (the check step)."""
    with pytest.raises(ValueError, match="registry_root is required: the model store the run "):
        parse_arguments(["epochs=2"])
    with pytest.raises(ValueError, match="registry_root is empty: set it to the model store"):
        parse_arguments(["epochs=2", "registry_root="])


@pytest.mark.parametrize(
    "expression", ["0 0 2 * * *", "0 */15 * * * ?", "30 0 9 ? * MON-FRI", "0 0 0 1,15 JAN-JUN/2 *"]
)
def test_valid_cron_expressions_pass(expression: str) -> None:
    assert ops.validate_cron(f"  {expression} ") == expression


SIX_FIELDS = "KFP needs 6: SECOND MINUTE HOUR DAY-OF-MONTH MONTH DAY-OF-WEEK"


@pytest.mark.parametrize(
    ("expression", "meant"),
    [
        ("0 2 * * *", "0 0 2 * * *"),
        ("*/15 9-17 ? * MON-FRI", "0 */15 9-17 ? * MON-FRI"),
        ("0 0 1,15 JAN-JUN/2 0", "0 0 0 1,15 JAN-JUN/2 0"),
        # not valid as they are, so a seconds field would not make them valid: no hint
        ("61 * * * *", None),
        ("0 24 * * *", None),
        ("0 0 0 * *", None),
        ("0 2 * 13 *", None),
        ("0 2 * * 7", None),
        ("*/0 * * * *", None),
        ("0 2 * * FUNDAY", None),
        ("0 1,,2 * * *", None),
    ],
)
def test_a_crontab_line_is_refused_with_a_hint_only_when_it_is_valid(
    expression: str, meant: str | None
) -> None:
    """KFP would take a 5-field line as seconds first (`0 2 * * *`: minute 2 of every hour)."""
    with pytest.raises(ops.InputError) as info:
        ops.validate_cron(expression)
    hint = f"; KFP cron has a leading seconds field, did you mean '{meant}'?" if meant else ""
    assert str(info.value) == f"cron expression {expression!r} has 5 fields, {SIX_FIELDS}{hint}"


@pytest.mark.parametrize("expression", ["", "0 0 2 * * * 2026"])
def test_a_cron_expression_of_another_length_is_refused(expression: str) -> None:
    count = len(expression.split())
    with pytest.raises(ops.InputError, match=f"^cron expression .* has {count} fields, KFP needs"):
        ops.validate_cron(expression)


def test_version_name_is_the_package_version_commit_and_dirty(tmp_path: Path) -> None:
    def git(*args: str) -> str:
        done = subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@e", *args],
                              cwd=tmp_path, check=True, capture_output=True, text=True)  # fmt: skip
        return done.stdout.strip()

    with pytest.raises(ops.OpsError, match="git failed in .*; pass --version-name"):
        ops.git_version_name(tmp_path, "0.1.0")
    git("init", "-q")
    (tmp_path / "a.txt").write_text("1")
    git("add", "a.txt")
    git("commit", "-q", "-m", "one")
    sha = git("rev-parse", "--short=7", "HEAD")
    (tmp_path / "untracked.txt").write_text("x")  # untracked files do not make it dirty
    assert ops.git_version_name(tmp_path, "0.1.0") == f"0.1.0-g{sha}"
    (tmp_path / "a.txt").write_text("2")
    assert ops.git_version_name(tmp_path, "0.1.0") == f"0.1.0-g{sha}-dirty"


def test_upload_creates_the_pipeline_then_the_version_named_from_git(
    standin: KfpStandin, package: Path, tmp_path: Path
) -> None:
    token = tmp_path / "token"
    token.write_text("from-file\n")
    result = invoke(standin, "upload", "--package", str(package),
                    KF_PIPELINES_SA_TOKEN_PATH=str(token))  # fmt: skip
    assert result.exit_code == 0, result.output
    name = ops.git_version_name()
    (create,) = standin.calls("POST", "/pipelines")
    assert create.json() == {"display_name": NAME}  # empty: the first version carries `name`
    (upload,) = standin.calls("POST", "/pipelines/upload_version")
    assert upload.query == {"name": name, "pipelineid": standin.pipelines[0]["pipeline_id"]}
    assert package.read_bytes() in upload.body
    assert f"uploaded version {name} (" in result.output
    assert {r.headers.get("authorization") for r in standin.requests} == {"Bearer from-file"}

    again = invoke(standin, "upload", "--package", str(package), KF_PIPELINES_TOKEN="s3cret")
    assert again.exit_code == ExitCode.BAD_INPUT
    assert again.output.startswith(f"FAILED: pipeline {NAME!r} already has a version named ")
    kept = invoke(standin, "upload", "--package", str(package), "--reuse-existing")
    assert kept.exit_code == 0 and f"kept existing version {name} " in kept.output
    assert standin.requests[-4].headers["authorization"] == "Bearer s3cret"
    added = invoke(standin, "upload", "--package", str(package), "--version-name", "v2")
    assert added.exit_code == 0 and len(standin.calls("POST", "/pipelines")) == 1
    assert [v["display_name"] for v in standin.versions] == [name, "v2"]


SCHEDULE = ["schedule", "--name", "n", "--version-name", "v", "--param", REGISTRY]


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (["submit", "--param", REGISTRY, "--param", "workers=0"],
         "FAILED: invalid pipeline parameters: workers must be >= 1, got 0"),
        ([*SCHEDULE, "--cron", "0 2 * * *"],
         f"FAILED: cron expression '0 2 * * *' has 5 fields, {SIX_FIELDS}; KFP cron has a "
         "leading seconds field, did you mean '0 0 2 * * *'?"),
        ([*SCHEDULE, "--cron", "61 * * * *"],
         f"FAILED: cron expression '61 * * * *' has 5 fields, {SIX_FIELDS}"),
    ],
)  # fmt: skip
def test_bad_input_is_refused_in_one_line_before_connecting(
    standin: KfpStandin, args: list[str], line: str
) -> None:
    result = invoke(standin, *args)
    assert (result.exit_code, result.stdout, result.stderr) == (ExitCode.BAD_INPUT, "", line + "\n")
    assert standin.requests == []


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["upload", "--package", "no/such.yaml"], "'no/such.yaml' does not exist"),
        ([*SCHEDULE, "--cron", "0 0 2 * * *", "--max-concurrency", "11"],
         "11 is not in the range 1<=x<=10"),
    ],
)  # fmt: skip
def test_a_bad_option_is_clicks_usage_error(
    standin: KfpStandin, args: list[str], message: str
) -> None:
    result = invoke(standin, *args)
    assert result.exit_code == ExitCode.BAD_INPUT and message in result.stderr
    assert standin.requests == []


@pytest.mark.parametrize(
    ("status", "code"), [(409, ExitCode.BAD_INPUT), (500, ExitCode.UNAVAILABLE)]
)
def test_an_api_error_is_one_line_naming_the_operation(
    standin: KfpStandin, package: Path, status: int, code: int
) -> None:
    standin.seed(NAME)
    standin.fail("POST", "/pipelines/upload_version", status, "minio unavailable")
    result = invoke(standin, "upload", "--package", str(package), "--version-name", "v1")
    assert result.exit_code == code
    (line,) = result.stderr.splitlines()
    assert line.startswith(
        f"FAILED: upload version 'v1' of pipeline '{NAME}' failed: HTTP {status} "
    )
    assert line.endswith(": minio unavailable")
    assert standin.versions == []


def test_submit_sends_the_package_and_the_typed_arguments(
    standin: KfpStandin, package: Path
) -> None:
    args = ["submit", "--package", str(package), "--experiment", "ci", "--param", REGISTRY]
    result = invoke(standin, *args, "--param", "epochs=2", "--param", "augment=no",
                    "--run-name", "r1")  # fmt: skip
    assert result.exit_code == 0, result.output
    (run,) = standin.runs
    sent = run["pipeline_spec"]  # kfp.Client sends the spec with its platform spec beside it
    assert run["display_name"] == "r1" and sent["pipeline_spec"]["pipelineInfo"]["name"] == NAME
    assert (
        "exec-train"
        in sent["platform_spec"]["platforms"]["kubernetes"]["deploymentSpec"]["executors"]
    )  # the placement kfp-kubernetes sets on the train task
    assert run["runtime_config"]["parameters"] == {
        "registry_root": "gs://b/models", "epochs": 2, "augment": False,
    }  # fmt: skip
    assert f"created run {run['run_id']}: r1" in result.output
    assert invoke(standin, *args).exit_code == 0  # a second run, in the same experiment
    (experiment,) = standin.experiments
    assert experiment["display_name"] == "ci"
    assert {r["experiment_id"] for r in standin.runs} == {experiment["experiment_id"]}


@pytest.mark.parametrize(
    ("states", "args", "code", "message"),
    [
        (["PENDING", "RUNNING", "SUCCEEDED"], [], 0, "run run-2 SUCCEEDED"),
        (["RUNNING", "FAILED"], [], ExitCode.RUN_FAILED,
         f"run run-2 ended FAILED: {TRAIN_FAILED}"),
        (["CANCELED"], [], ExitCode.RUN_FAILED,
         "run run-2 ended CANCELED: no failed task reported"),
        (["RUNNING"], ["--timeout", "1"], ExitCode.TIMED_OUT,
         "did not finish within 1 s (last state: RUNNING)"),
    ],
)  # fmt: skip
def test_submit_wait_names_the_outcome_in_its_exit_code(
    standin: KfpStandin, package: Path, states: list[str], args: list[str], code: int,
    message: str, monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    monkeypatch.setattr(ops.time, "sleep", lambda seconds: None)  # the timeout still counts
    standin.script_runs(states, FAILED_TASKS if "FAILED" in states else None)
    result = invoke(standin, "submit", "--package", str(package), "--param", REGISTRY, "--wait",
                    *args)  # fmt: skip
    assert result.exit_code == code, result.output
    assert message in result.output
    assert "root" not in result.output  # the failed leaf task, not the DAG around it


def test_wait_retries_transient_errors_but_not_forever(standin: KfpStandin) -> None:
    client = ops.connect(standin.url, None, None, None)
    standin.runs.append({"run_id": "r1"})
    standin.script_runs(["RUNNING", "SUCCEEDED"])
    standin.fail("GET", "/runs/r1", 503, "restarting", times=2)
    assert ops.wait_for_run(client, "r1", HANG_S, poll_interval=0.01).state == "SUCCEEDED"
    standin.fail("GET", "/runs/r1", 500, "broken", times=99)
    with pytest.raises(ops.OpsError, match="get run r1 failed: HTTP 500.*: broken$"):
        ops.wait_for_run(client, "r1", HANG_S, poll_interval=0.01)
    assert len(standin.calls("GET", "/runs/r1")) == 4 + ops.MAX_CONSECUTIVE_POLL_ERRORS + 1
    with pytest.raises(ops.OpsError, match="get run nope failed: HTTP 404"):
        ops.wait_for_run(client, "nope", HANG_S, poll_interval=0.01)  # not transient: at once


def test_submit_and_schedule_an_uploaded_version_by_name(
    standin: KfpStandin, package: Path
) -> None:
    pid = standin.seed(NAME, "0.1.0-gabc")
    vid = standin.versions[0]["pipeline_version_id"]
    result = invoke(standin, "submit", "--version-name", "0.1.0-gabc", "--param", REGISTRY)
    assert result.exit_code == 0, result.output
    (run,) = standin.runs
    assert run["pipeline_version_reference"] == {"pipeline_id": pid, "pipeline_version_id": vid}
    assert "pipeline_spec" not in run and run["display_name"].startswith(f"{NAME} 0.1.0-gabc ")

    result = invoke(standin, "schedule", "--name", "nightly", "--cron", "0 0 2 * * *",
                    "--version-name", "0.1.0-gabc", "--param", REGISTRY, "--param", "epochs=8",
                    "--max-concurrency", "2")  # fmt: skip
    assert result.exit_code == 0, result.output
    (schedule,) = standin.recurring_runs
    assert (schedule["display_name"], schedule["trigger"]) == (
        "nightly", {"cron_schedule": {"cron": "0 0 2 * * *"}},
    )  # fmt: skip
    assert (schedule["max_concurrency"], schedule["no_catchup"]) == (2, True)
    assert schedule["runtime_config"]["parameters"] == {"registry_root": "gs://b/models",
                                                        "epochs": 8}  # fmt: skip
    assert schedule["pipeline_version_reference"]["pipeline_version_id"] == vid

    missing = invoke(standin, "submit", "--version-name", "0.0.0-gnone", "--param", REGISTRY)
    assert missing.exit_code == ExitCode.BAD_INPUT
    assert f"'{NAME}' has no version named '0.0.0-gnone'; upload it first" in missing.stderr
    standin.seed(NAME)  # in another namespace: a name is not enough
    twice = invoke(standin, "submit", "--version-name", "0.1.0-gabc", "--param", REGISTRY)
    assert f"look up pipeline '{NAME}' failed: Multiple pipelines with the name" in twice.output


def test_a_package_that_is_no_pipeline_is_one_error(standin: KfpStandin, tmp_path: Path) -> None:
    (tmp_path / "other.yaml").write_text("kind: ConfigMap\n")
    result = invoke(standin, "submit", "--package", str(tmp_path / "other.yaml"), "--param",
                    REGISTRY)  # fmt: skip
    assert result.exit_code == ExitCode.BAD_INPUT and not standin.runs
    message = 'failed: Message type "ml_pipelines.PipelineSpec" has no field named "kind"'
    assert message in result.output


def test_the_make_targets_wrap_the_commands(
    standin: KfpStandin, package: Path, tmp_path: Path
) -> None:
    """make/ops.mk, included from a stub Makefile (install and compile do nothing), runs
    ``python -m pipeline`` as CI does: the token from the environment, RUN_FAILED's exit code on
    a failed run."""
    makefile = tmp_path / "Makefile"
    makefile.write_text(f"PY := {sys.executable}\ninstall:\n\t@true\ncompile:\n\t@true\n"
                        f"include {ROOT / 'make' / 'ops.mk'}\n")  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith("KF_PIPELINES_")}
    env.update(HOME=str(tmp_path), KF_PIPELINES_TOKEN="tok")

    def make(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["make", "-s", "-f", str(makefile), *args, f"KFP_HOST={standin.url}"],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
        )  # fmt: skip

    assert make("upload", f"PACKAGE={package}", "VERSION_NAME=v9").returncode == 0
    assert [v["display_name"] for v in standin.versions] == ["v9"]
    standin.script_runs(["FAILED"], FAILED_TASKS)
    submit = make("submit", "VERSION_NAME=v9", f"PARAMS={REGISTRY} epochs=2", "WAIT=1")
    failed, make_said = submit.stderr.splitlines()[-2:]
    assert failed == f"FAILED: run {standin.runs[0]['run_id']} ended FAILED: {TRAIN_FAILED}"
    assert make_said.endswith(f": submit] Error {ExitCode.RUN_FAILED:d}")  # the run failed
    assert standin.runs[0]["runtime_config"]["parameters"]["epochs"] == 2
    schedule = make("schedule", "SCHEDULE_NAME=nightly", "CRON=0 0 2 * * *", "VERSION_NAME=v9",
                    f"PARAMS={REGISTRY}", "MAX_CONCURRENCY=3")  # fmt: skip
    assert schedule.returncode == 0, schedule.stderr
    (job,) = standin.recurring_runs
    assert (job["max_concurrency"], job["no_catchup"]) == (3, True)
    assert {r.headers.get("authorization") for r in standin.requests} == {"Bearer tok"}
