"""Tests of pipeline.ops / pipeline.ops_cli: the real kfp.Client over HTTP to a local stand-in.

Mocked: only the KFP API server itself (tests/kfp_standin.py), since no cluster runs here.
The client, its generated REST layer, urllib3 and the sockets are real.
"""

# No `from __future__ import annotations`: kfp reads the component annotations at runtime.
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import kfp
import pytest
import yaml
from click.testing import CliRunner
from kfp import dsl

from pipeline import ops
from pipeline.cli import cli
from tests.kfp_standin import KfpStandin

ROOT = Path(__file__).resolve().parents[1]
PIPELINE_NAME = "kfp-horovod-mnist"
KFP_ENV = (
    "KF_PIPELINES_ENDPOINT",
    "KF_PIPELINES_NAMESPACE",
    "KF_PIPELINES_TOKEN",
    "KF_PIPELINES_SA_TOKEN_PATH",
    "KF_PIPELINES_UI_ENDPOINT",
    "KF_PIPELINES_DEFAULT_EXPERIMENT_NAME",
    "KF_PIPELINES_OVERRIDE_EXPERIMENT_NAME",
    "KF_PIPELINES_IAP_OAUTH2_CLIENT_ID",
)


@dsl.component(base_image="python:3.11-slim")
def _echo(text: str, epochs: int, rate: float, gpu: bool, layers: list, extra: dict) -> str:
    return f"{text} {epochs} {rate} {gpu} {layers} {extra}"


@dsl.pipeline(name=PIPELINE_NAME)
def _tiny_pipeline(
    run_tag: str,
    epochs: int = 4,
    learning_rate: float = 0.001,
    use_gpu: bool = False,
    layers: list = [128, 64],  # noqa: B006 - a KFP default value, never mutated
    extra: dict = {"a": 1},  # noqa: B006
) -> None:
    _echo(text=run_tag, epochs=epochs, rate=learning_rate, gpu=use_gpu, layers=layers, extra=extra)


@pytest.fixture(autouse=True)
def _isolated_kfp(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No KF_PIPELINES_* from the outside, and a private kfp context file (kfp.Client reads
    ~/.config/kfp/context.json and set_user_namespace writes it)."""
    for name in KFP_ENV:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(kfp.Client, "_LOCAL_KFP_CONTEXT", str(tmp_path / "kfp-context.json"))


@pytest.fixture(scope="module")
def package(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A compiled tiny pipeline named like the real one, with one input of each type."""
    path = tmp_path_factory.mktemp("pkg") / "pipeline.yaml"
    kfp.compiler.Compiler().compile(_tiny_pipeline, str(path))
    return path


@pytest.fixture
def spec(package: Path) -> dict[str, Any]:
    return ops.read_pipeline_spec(package)


@pytest.fixture
def standin() -> Any:
    with KfpStandin() as server:
        yield server


@pytest.fixture
def client(standin: KfpStandin) -> kfp.Client:
    return ops.connect(standin.url, None, None, None)


def invoke(args: list[str], standin: KfpStandin | None = None) -> Any:
    """Run ``python -m pipeline ARGS`` in-process, the host coming from KF_PIPELINES_ENDPOINT."""
    env = {"KF_PIPELINES_ENDPOINT": standin.url} if standin else {}
    return CliRunner().invoke(cli, args, env=env, catch_exceptions=False)


def _filter_name(recorded: Any) -> str:
    predicates = json.loads(recorded.q("filter"))["predicates"]
    assert predicates[0]["key"] == "display_name"
    return str(predicates[0]["stringValue"])


# ---- parameters -------------------------------------------------------------------------------


def test_declared_parameters_come_from_the_compiled_yaml(spec: dict[str, Any]) -> None:
    declared = ops.declared_parameters(spec)
    assert {n: d["parameterType"] for n, d in declared.items()} == {
        "run_tag": "STRING",
        "epochs": "NUMBER_INTEGER",
        "learning_rate": "NUMBER_DOUBLE",
        "use_gpu": "BOOLEAN",
        "layers": "LIST",
        "extra": "STRUCT",
    }
    with pytest.raises(ops.OpsError, match=r"missing required pipeline parameter\(s\): run_tag$"):
        ops.parse_parameters([], declared)


def test_parameters_are_coerced_to_the_declared_types(spec: dict[str, Any]) -> None:
    values = ops.parse_parameters(
        [
            "run_tag=nightly=1",
            "epochs=3",
            "learning_rate=1e-3",
            "use_gpu=TRUE",
            "layers=[1, 2]",
            'extra={"b": 2}',
        ],
        ops.declared_parameters(spec),
    )
    assert values == {
        "run_tag": "nightly=1",
        "epochs": 3,
        "learning_rate": 0.001,
        "use_gpu": True,
        "layers": [1, 2],
        "extra": {"b": 2},
    }
    assert type(values["epochs"]) is int and type(values["learning_rate"]) is float


@pytest.mark.parametrize(
    ("pairs", "message"),
    [
        (["run_tag=x", "epochs=3", "batch=64", "lr=1"], "unknown pipeline parameter(s): batch, lr"),
        (["run_tag=x", "epochs=three"], "'epochs' is declared NUMBER_INTEGER but got 'three'"),
        (["run_tag=x", "learning_rate=fast"], "'learning_rate' is declared NUMBER_DOUBLE"),
        (["run_tag=x", "use_gpu=maybe"], "'use_gpu' is declared BOOLEAN but got 'maybe'"),
        (["run_tag=x", "layers={}"], "'layers' is declared LIST"),
        (["run_tag=x", "extra=[1]"], "'extra' is declared STRUCT"),
        (["epochs=3"], "missing required pipeline parameter(s): run_tag"),
        (["run_tag"], "bad parameter 'run_tag': expected NAME=VALUE"),
        (["=3"], "bad parameter '=3'"),
        (["run_tag=a", "run_tag=b"], "'run_tag' is given more than once"),
    ],
)
def test_bad_parameters_are_rejected_naming_them(
    spec: dict[str, Any], pairs: list[str], message: str
) -> None:
    with pytest.raises(ops.OpsError) as info:
        ops.parse_parameters(pairs, ops.declared_parameters(spec))
    assert message in str(info.value)


def test_read_pipeline_spec_rejects_missing_and_non_pipeline_files(tmp_path: Path) -> None:
    with pytest.raises(ops.OpsError, match="does not exist; compile it first"):
        ops.read_pipeline_spec(tmp_path / "nope.yaml")
    other = tmp_path / "other.yaml"
    other.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "ConfigMap"}))
    with pytest.raises(ops.OpsError, match="is not a compiled KFP v2 pipeline"):
        ops.read_pipeline_spec(other)


# ---- cron ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "expression",
    [
        "0 0 2 * * *",
        "0 */15 * * * ?",
        "30 0 9 ? * MON-FRI",
        "0 0 0 1,15 JAN-JUN/2 *",
        "0 0 0 * * 0",
    ],
)
def test_valid_cron_expressions_pass(expression: str) -> None:
    assert ops.validate_cron(f"  {expression} ") == expression


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ("0 2 * * *", "has 5 fields, KFP needs 6"),
        ("0 2 * * *", "did you mean '0 0 2 * * *'?"),
        ("0 0 25 * * *", "cron hour field: 25 is out of range 0-23"),
        ("60 0 0 * * *", "cron second field: 60 is out of range 0-59"),
        ("0 0 0 0 * *", "cron day of month field: 0 is out of range 1-31"),
        ("0 0 0 * 13 *", "cron month field: 13 is out of range 1-12"),
        ("0 0 0 * * FUNDAY", "cron day of week field: 'FUNDAY' is not a number"),
        ("0 */0 * * * *", "step '0' must be a positive number"),
        ("0 ? * * * *", "'?' is only allowed in the day fields"),
        ("0 0 5-2 * * *", "range '5-2' runs backwards"),
        ("0 0 1,,2 * * *", "empty list item"),
        ("", "has 0 fields"),
    ],
)
def test_bad_cron_expressions_are_rejected_naming_the_field(expression: str, message: str) -> None:
    with pytest.raises(ops.OpsError) as info:
        ops.validate_cron(expression)
    assert message in str(info.value)


CRON_MESSAGES = [
    (
        "0 2 * * *",  # a crontab line: KFP's parser would read it as "minute 2 of every hour"
        "cron expression '0 2 * * *' has 5 fields, KFP needs 6: SECOND MINUTE HOUR DAY-OF-MONTH "
        "MONTH DAY-OF-WEEK; KFP cron has a leading seconds field, did you mean '0 0 2 * * *'?",
    ),
    ("0 0 25 * * *", "cron hour field: 25 is out of range 0-23"),
    ("0 0 0 * * FUNDAY", "cron day of week field: 'FUNDAY' is not a number"),
    ("0 0 5-2 * * *", "cron hour field: range '5-2' runs backwards"),
]


@pytest.mark.parametrize(("expression", "ours"), CRON_MESSAGES)
def test_own_cron_check_names_the_field_and_the_fix(expression: str, ours: str) -> None:
    with pytest.raises(ops.OpsError) as own:
        ops.validate_cron(expression)
    assert str(own.value) == ours


# ---- version name -------------------------------------------------------------------------------


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@example.com", *args],
        cwd=repo,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()


def test_git_version_name_is_package_version_commit_and_dirty(tmp_path: Path) -> None:
    _git(tmp_path, "init", "-q")
    (tmp_path / "a.txt").write_text("1")
    _git(tmp_path, "add", "a.txt")
    _git(tmp_path, "commit", "-q", "-m", "one")
    sha = _git(tmp_path, "rev-parse", "--short=7", "HEAD")
    assert ops.git_version_name(tmp_path, "0.1.0") == f"0.1.0-g{sha}"
    (tmp_path / "untracked.txt").write_text("x")  # untracked files do not make it dirty
    assert ops.git_version_name(tmp_path, "0.1.0") == f"0.1.0-g{sha}"
    (tmp_path / "a.txt").write_text("2")
    assert ops.git_version_name(tmp_path, "0.1.0") == f"0.1.0-g{sha}-dirty"


def test_git_version_name_outside_git_says_to_pass_version_name(tmp_path: Path) -> None:
    with pytest.raises(ops.OpsError, match="pass --version-name"):
        ops.git_version_name(tmp_path, "0.1.0")


# ---- connecting -------------------------------------------------------------------------------


def test_connect_sends_the_token(standin: KfpStandin) -> None:
    client = ops.connect(standin.url + "/", None, "s3cret", None)
    assert ops.find_pipeline(client, "absent") is None
    (lookup,) = standin.calls("GET", "/pipelines")
    assert lookup.headers.get("authorization") == "Bearer s3cret"
    assert _filter_name(lookup) == "absent"


def test_connect_reads_a_service_account_token_file(standin: KfpStandin, tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("from-file\n")
    client = ops.connect(standin.url, None, None, str(token_file))
    ops.find_pipeline(client, "x")
    (lookup,) = standin.calls("GET", "/pipelines")
    assert lookup.headers.get("authorization") == "Bearer from-file"


# ---- upload -----------------------------------------------------------------------------------


def test_upload_creates_the_pipeline_then_uploads_the_named_version(
    standin: KfpStandin, client: kfp.Client, package: Path
) -> None:
    pipeline_id, version_id, uploaded = ops.upload(client, package, "0.1.0-g1a2b3c4", None)
    assert uploaded
    (create,) = standin.calls("POST", "/pipelines")
    assert create.json == {"display_name": PIPELINE_NAME}  # from the package's pipelineInfo
    (upload,) = standin.calls("POST", "/pipelines/upload_version")
    assert upload.q("name") == "0.1.0-g1a2b3c4"
    assert upload.q("pipelineid") == pipeline_id
    assert upload.files["uploadfile"] == package.read_bytes()
    assert not standin.calls("POST", "/pipelines/upload")
    (version,) = standin.versions.values()
    assert version["display_name"] == "0.1.0-g1a2b3c4"


def test_upload_adds_a_version_to_an_existing_pipeline(
    standin: KfpStandin, client: kfp.Client, package: Path
) -> None:
    pipeline_id = standin.seed_pipeline(PIPELINE_NAME, {"0.0.9-gold": {"root": {}}})
    found_id, _, uploaded = ops.upload(client, package, "0.1.0-gnew", None)
    assert uploaded and found_id == pipeline_id
    assert not standin.calls("POST", "/pipelines")
    (lookup,) = standin.calls("GET", f"/pipelines/{pipeline_id}/versions")
    assert _filter_name(lookup) == "0.1.0-gnew"
    assert sorted(v["display_name"] for v in standin.versions.values()) == [
        "0.0.9-gold",
        "0.1.0-gnew",
    ]


def test_upload_of_an_existing_version_fails_unless_reused(
    standin: KfpStandin, client: kfp.Client, package: Path
) -> None:
    ops.upload(client, package, "0.1.0-gsame", None)
    with pytest.raises(ops.OpsError, match="already has a version named '0.1.0-gsame'"):
        ops.upload(client, package, "0.1.0-gsame", None)
    assert not ops.upload(client, package, "0.1.0-gsame", None, reuse=True)[2]
    assert len(standin.calls("POST", "/pipelines/upload_version")) == 1


def test_upload_maps_server_409_and_500(
    standin: KfpStandin, client: kfp.Client, package: Path
) -> None:
    standin.seed_pipeline(PIPELINE_NAME)
    standin.fail("POST", "/pipelines/upload_version", 409, "version raced")
    with pytest.raises(ops.OpsError, match="HTTP 409.*version raced") as info:
        ops.upload(client, package, "v1", None)
    assert info.value.status == 409 and not info.value.transient
    standin.fail("POST", "/pipelines/upload_version", 500, "minio unavailable")
    with pytest.raises(
        ops.OpsError, match="upload version 'v1'.*HTTP 500.*minio unavailable"
    ) as info:
        ops.upload(client, package, "v1", None)
    assert info.value.transient


def test_lookups_refuse_ambiguous_names(standin: KfpStandin, client: kfp.Client) -> None:
    standin.seed_pipeline("dup", namespace="team-a")
    standin.seed_pipeline("dup", namespace="team-b")
    with pytest.raises(ops.OpsError, match="look up pipeline 'dup'"):
        ops.find_pipeline(client, "dup")


def test_upload_cli_names_the_version_from_git(standin: KfpStandin, package: Path) -> None:
    result = invoke(["upload", "--package", str(package)], standin)
    assert result.exit_code == 0, result.output
    expected = ops.git_version_name()
    assert f"uploaded version {expected} " in result.output
    (upload,) = standin.calls("POST", "/pipelines/upload_version")
    assert upload.q("name") == expected


def test_upload_cli_rejects_a_missing_package_before_connecting(standin: KfpStandin) -> None:
    result = invoke(["upload", "--package", "no/such.yaml", "--version-name", "v"], standin)
    assert result.exit_code == 1
    assert "pipeline package no/such.yaml does not exist" in result.output
    assert standin.requests == []


# ---- submit -----------------------------------------------------------------------------------


def test_submit_from_package_sends_spec_and_typed_parameters(
    standin: KfpStandin, package: Path
) -> None:
    args = ["submit", "--package", str(package), "--experiment", "ci", "--run-name", "r1"]
    result = invoke(
        [*args, "--param", "run_tag=t", "--param", "epochs=2", "--param", "use_gpu=no"], standin
    )
    assert result.exit_code == 0, result.output
    (create,) = standin.calls("POST", "/runs")
    body = create.json
    assert body["display_name"] == "r1"
    assert body["pipeline_spec"]["pipelineInfo"]["name"] == PIPELINE_NAME
    assert body["runtime_config"]["parameters"] == {"run_tag": "t", "epochs": 2, "use_gpu": False}
    (experiment,) = standin.experiments.values()
    assert (
        experiment["display_name"] == "ci" and body["experiment_id"] == experiment["experiment_id"]
    )
    assert f"created run {standin.runs and next(iter(standin.runs))}" in result.output
    # a second submit reuses the experiment
    assert invoke([*args, "--param", "run_tag=t"], standin).exit_code == 0
    assert len(standin.calls("POST", "/experiments")) == 1
    assert len(standin.calls("POST", "/runs")) == 2


def test_submit_rejects_unknown_parameters_before_connecting(
    standin: KfpStandin, package: Path
) -> None:
    result = invoke(
        ["submit", "--package", str(package), "--param", "run_tag=t", "--param", "epoch=2"],
        standin,
    )
    assert result.exit_code == 1
    assert "unknown pipeline parameter(s): epoch" in result.output
    assert "epochs" in result.output  # the declared names are listed
    assert standin.requests == []


def test_submit_wait_succeeds(standin: KfpStandin, package: Path) -> None:
    standin.script_runs(["PENDING", "RUNNING", "SUCCEEDED"])
    result = invoke(
        [
            "submit",
            "--package",
            str(package),
            "--param",
            "run_tag=t",
            "--wait",
            "--poll-interval",
            "0.01",
        ],
        standin,
    )
    assert result.exit_code == 0, result.output
    run_id = next(iter(standin.runs))
    assert len(standin.calls("GET", f"/runs/{run_id}")) == 3
    assert f"run {run_id} SUCCEEDED" in result.output


FAILED_TASKS = [
    {
        "task_id": "t0",
        "display_name": "root",
        "state": "FAILED",
        "child_tasks": [{"task_id": "t2"}],
    },
    {"task_id": "t1", "display_name": "data-prep", "state": "SUCCEEDED"},
    {
        "task_id": "t2",
        "display_name": "train",
        "state": "FAILED",
        "error": {"code": 2, "message": "horovodrun exited with 1"},
    },
]


def test_submit_wait_exits_3_naming_the_failed_task(standin: KfpStandin, package: Path) -> None:
    standin.script_runs(["RUNNING", "FAILED"], FAILED_TASKS)
    result = invoke(
        [
            "submit",
            "--package",
            str(package),
            "--param",
            "run_tag=t",
            "--wait",
            "--poll-interval",
            "0.01",
        ],
        standin,
    )
    assert result.exit_code == 3, result.output
    assert "ended FAILED: failed task(s): train: horovodrun exited with 1" in result.output
    assert "root" not in result.output.split("ended FAILED")[1]


def test_submit_wait_exits_4_on_timeout(standin: KfpStandin, package: Path) -> None:
    standin.script_runs(["RUNNING"])
    started = time.monotonic()
    result = invoke(
        [
            "submit",
            "--package",
            str(package),
            "--param",
            "run_tag=t",
            "--wait",
            "--timeout",
            "1",
            "--poll-interval",
            "0.2",
        ],
        standin,
    )
    assert result.exit_code == 4, result.output
    assert "did not finish within 1 s (last state: RUNNING)" in result.output
    assert 1 <= time.monotonic() - started < 5


def test_wait_treats_canceled_as_failure(
    standin: KfpStandin, client: kfp.Client, spec: Any
) -> None:
    standin.script_runs(["CANCELED"])
    run = _run(standin, client)
    with pytest.raises(ops.RunFailedError, match="ended CANCELED: no failed task reported$"):
        ops.wait_for_run(client, run.run_id, 5, poll_interval=0.01)


def _run(standin: KfpStandin, client: kfp.Client) -> Any:
    pipeline_id = standin.seed_pipeline(f"p{len(standin.pipelines)}", {"v": {"root": {}}})
    version_id = list(standin.versions)[-1]
    return client.run_pipeline(
        ops.experiment_id(client, "e"), "r", pipeline_id=pipeline_id, version_id=version_id
    )


def test_wait_retries_transient_errors_but_not_forever(
    standin: KfpStandin, client: kfp.Client
) -> None:
    standin.script_runs(["RUNNING", "SUCCEEDED"])
    run = _run(standin, client)
    standin.fail("GET", f"/runs/{run.run_id}", 503, "restarting", times=2)
    assert ops.wait_for_run(client, run.run_id, 10, poll_interval=0.01).state == "SUCCEEDED"

    standin.script_runs(["RUNNING"])
    run = _run(standin, client)
    standin.fail("GET", f"/runs/{run.run_id}", 500, "broken", times=None)
    with pytest.raises(ops.OpsError, match=f"get run {run.run_id} failed: HTTP 500.*broken"):
        ops.wait_for_run(client, run.run_id, 10, poll_interval=0.01)
    assert len(standin.calls("GET", f"/runs/{run.run_id}")) == ops.MAX_CONSECUTIVE_POLL_ERRORS + 1


def test_wait_on_an_unknown_run_is_not_found_at_once(client: kfp.Client) -> None:
    with pytest.raises(ops.OpsError, match="get run nope failed: HTTP 404.*run nope not found"):
        ops.wait_for_run(client, "nope", 10, poll_interval=0.01)


def test_submit_an_uploaded_version_by_name(standin: KfpStandin, package: Path, spec: Any) -> None:
    pipeline_id = standin.seed_pipeline(PIPELINE_NAME, {"0.1.0-gabc": spec})
    result = invoke(
        [
            "submit",
            "--version-name",
            "0.1.0-gabc",
            "--param",
            "run_tag=t",
            "--param",
            "learning_rate=0.5",
        ],
        standin,
    )
    assert result.exit_code == 0, result.output
    (create,) = standin.calls("POST", "/runs")
    assert create.json["pipeline_version_reference"] == {
        "pipeline_id": pipeline_id,
        "pipeline_version_id": next(iter(standin.versions)),
    }
    assert "pipeline_spec" not in create.json
    assert create.json["runtime_config"]["parameters"] == {"run_tag": "t", "learning_rate": 0.5}
    assert create.json["display_name"].startswith(f"{PIPELINE_NAME} 0.1.0-gabc ")

    missing = invoke(["submit", "--version-name", "0.0.0-gnone"], standin)
    assert missing.exit_code == 1
    assert f"pipeline '{PIPELINE_NAME}' has no version named '0.0.0-gnone'" in missing.output


def test_submit_surfaces_a_server_error_on_create(standin: KfpStandin, package: Path) -> None:
    standin.fail("POST", "/runs", 400, "invalid pipeline spec: bad input")
    result = invoke(
        ["submit", "--package", str(package), "--param", "run_tag=t", "--run-name", "r"], standin
    )
    assert result.exit_code == 1
    assert (
        "create run 'r' failed: HTTP 400 Bad Request: invalid pipeline spec: bad input"
        in result.output
    )


def test_submit_subprocess_reads_the_environment_and_exits_3(
    standin: KfpStandin, package: Path
) -> None:
    """The real entry point (python -m pipeline), host and token from the environment."""
    standin.script_runs(["FAILED"], FAILED_TASKS)
    env = {k: v for k, v in os.environ.items() if k not in KFP_ENV}
    env.update(
        KF_PIPELINES_ENDPOINT=standin.url, KF_PIPELINES_TOKEN="tok", HOME=str(package.parent)
    )
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pipeline",
            "submit",
            "--package",
            str(package),
            "--param",
            "run_tag=t",
            "--wait",
            "--poll-interval",
            "0.01",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 3, proc.stderr
    assert "failed task(s): train" in proc.stderr
    assert all(r.headers.get("authorization") == "Bearer tok" for r in standin.requests)


# ---- schedules --------------------------------------------------------------------------------


def test_schedule_create_sends_cron_concurrency_and_catchup(standin: KfpStandin, spec: Any) -> None:
    pipeline_id = standin.seed_pipeline(PIPELINE_NAME, {"0.1.0-gabc": spec})
    result = invoke(
        [
            "schedule", "create", "--name", "nightly", "--cron", "0 0 2 * * *",
            "--version-name", "0.1.0-gabc", "--param", "run_tag=nightly", "--param", "epochs=8",
            "--max-concurrency", "2",
        ],
        standin,
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    (create,) = standin.calls("POST", "/recurringruns")
    body = create.json
    assert body["display_name"] == "nightly"
    assert body["trigger"] == {"cron_schedule": {"cron": "0 0 2 * * *"}}
    assert body["max_concurrency"] == 2
    assert body["no_catchup"] is True
    assert body["mode"] == "ENABLE"
    assert body["pipeline_version_reference"]["pipeline_id"] == pipeline_id
    assert body["runtime_config"]["parameters"] == {"run_tag": "nightly", "epochs": 8}

    again = invoke(
        [
            "schedule",
            "create",
            "--name",
            "nightly",
            "--cron",
            "0 0 3 * * *",
            "--version-name",
            "0.1.0-gabc",
            "--param",
            "run_tag=x",
        ],
        standin,
    )
    assert again.exit_code == 1
    assert "a schedule named 'nightly' exists already" in again.output


def test_schedule_create_rejects_bad_input_before_connecting(standin: KfpStandin) -> None:
    base = ["schedule", "create", "--name", "n", "--version-name", "v"]
    result = invoke([*base, "--cron", "0 2 * * *"], standin)
    assert result.exit_code == 1
    assert "has 5 fields, KFP needs 6" in result.output
    assert standin.requests == []
    standin.seed_pipeline(PIPELINE_NAME, {"v": {"root": {}}})
    result = invoke([*base, "--cron", "0 0 2 * * *", "--max-concurrency", "11"], standin)
    assert result.exit_code == 1
    assert "max_concurrency must be between 1 and 10, got 11" in result.output
    assert not standin.calls("POST", "/recurringruns")


def test_schedule_list_pause_resume_delete(standin: KfpStandin, spec: Any) -> None:
    standin.seed_pipeline(PIPELINE_NAME, {"v1": spec})
    for name in ("nightly", "weekly"):
        create = [
            "schedule",
            "create",
            "--name",
            name,
            "--cron",
            "0 0 2 * * *",
            "--version-name",
            "v1",
            "--param",
            "run_tag=t",
        ]
        assert invoke(create, standin).exit_code == 0
    nightly, weekly = standin.recurring_runs

    listed = invoke(["schedule", "list", "--pipeline-name", PIPELINE_NAME], standin)
    assert listed.exit_code == 0, listed.output
    lines = listed.output.strip().splitlines()
    assert lines[0].startswith("ID\tNAME\tMODE\tCRON")
    assert lines[1].split("\t")[:4] == [nightly, "nightly", "ENABLE", "0 0 2 * * *"]
    assert len(lines) == 3

    assert invoke(["schedule", "pause", "nightly"], standin).exit_code == 0
    assert standin.calls("POST", f"/recurringruns/{nightly}:disable")
    assert standin.recurring_runs[nightly]["mode"] == "DISABLE"
    assert invoke(["schedule", "resume", nightly], standin).exit_code == 0  # by id
    assert standin.recurring_runs[nightly]["mode"] == "ENABLE"
    deleted = invoke(["schedule", "delete", "weekly"], standin)
    assert deleted.exit_code == 0 and f"deleted schedule {weekly}: weekly" in deleted.output
    assert standin.calls("DELETE", f"/recurringruns/{weekly}")
    assert list(standin.recurring_runs) == [nightly]

    missing = invoke(["schedule", "delete", "monthly"], standin)
    assert missing.exit_code == 1
    assert "no schedule named or with id 'monthly'" in missing.output


def test_schedule_delete_surfaces_a_server_error(standin: KfpStandin, spec: Any) -> None:
    standin.seed_pipeline(PIPELINE_NAME, {"v1": spec})
    create = [
        "schedule",
        "create",
        "--name",
        "n",
        "--cron",
        "0 0 2 * * *",
        "--version-name",
        "v1",
        "--param",
        "run_tag=t",
    ]
    assert invoke(create, standin).exit_code == 0
    (job_id,) = standin.recurring_runs
    standin.fail("DELETE", f"/recurringruns/{job_id}", 500, "scheduler unavailable")
    result = invoke(["schedule", "delete", "n"], standin)
    assert result.exit_code == 1
    assert f"delete schedule {job_id} failed: HTTP 500" in result.output
    assert "scheduler unavailable" in result.output
    assert job_id in standin.recurring_runs


# ---- make targets -----------------------------------------------------------------------------


@pytest.mark.e2e
@pytest.mark.skipif(shutil.which("make") is None, reason="needs GNU make")
def test_make_targets_wrap_the_cli(standin: KfpStandin, package: Path, tmp_path: Path) -> None:
    """make/ops.mk, included from a stub Makefile (install/compile do nothing), end to end."""
    makefile = tmp_path / "Makefile"
    makefile.write_text(
        f"PY := {sys.executable}\ninstall:\n\t@true\ncompile:\n\t@true\n"
        f"include {ROOT / 'make' / 'ops.mk'}\n"
    )

    def make(*args: str) -> subprocess.CompletedProcess[str]:
        env = {k: v for k, v in os.environ.items() if k not in KFP_ENV}
        env["HOME"] = str(tmp_path)
        return subprocess.run(
            ["make", "-s", "-f", str(makefile), *args, f"KFP_HOST={standin.url}"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )

    upload = make("upload", f"PACKAGE={package}", "VERSION_NAME=v9")
    assert upload.returncode == 0, upload.stderr
    (version,) = standin.versions.values()
    assert version["display_name"] == "v9"

    standin.script_runs(["RUNNING", "FAILED"], FAILED_TASKS)
    submit = make("submit", "VERSION_NAME=v9", "PARAMS=run_tag=t epochs=2", "WAIT=1")
    assert submit.returncode != 0
    assert "failed task(s): train" in submit.stderr
    (run,) = standin.runs.values()
    assert run["runtime_config"]["parameters"] == {"run_tag": "t", "epochs": 2}

    schedule = make("schedule", "SCHEDULE_NAME=nightly", "CRON=0 0 2 * * *", "VERSION_NAME=v9",
                    "PARAMS=run_tag=n", "MAX_CONCURRENCY=3")  # fmt: skip
    assert schedule.returncode == 0, schedule.stderr
    (job,) = standin.recurring_runs.values()
    assert (job["max_concurrency"], job["no_catchup"]) == (3, True)
    assert make("schedule-pause", "SCHEDULE_NAME=nightly").returncode == 0
    assert job["mode"] == "DISABLE"
    assert make("schedule-delete", "SCHEDULE_NAME=nightly").returncode == 0
    assert not standin.recurring_runs
