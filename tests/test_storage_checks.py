"""Storage a run cannot use stops it in the first seconds, in one line, before any work: the
real commands (``python -m pipeline run-local``, ``render-inferenceservice``, ``sync-serving``,
and the pipeline's check step as kfp.local runs it) with the real storage client, on
fake-gcs-server (a missing bucket), behind `standins.fake_gcs.ReadOnlyProxy` (a bucket the
identity may only read: the emulator has no IAM to express one), and without credentials.

Each asserts the one ``FAILED:`` line, the expected failure's exit code, and that nothing was
written: no run folder, no object in the bucket."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from components.common import defaults
from components.common.failure import ExitCode
from pipeline import local_run
from pipeline.local_run import quiet_console
from tests.conftest import bucket_objects

ROOT = Path(__file__).resolve().parents[1]
NO_CREDENTIALS = "this process's identity found no Google credentials to reach bucket"
HOW = "provide Application Default Credentials"
READ_ONLY = "this process's identity lacks storage.objects.create on bucket"


def failed_line(args: list[str], cwd: Path = ROOT, env: dict[str, str] | None = None) -> str:
    """The one line ``python -m pipeline ARGS`` printed (stdout and stderr), failing with the
    expected failure's exit code."""
    env = dict(os.environ if env is None else env, PYTHONPATH=str(ROOT))  # this checkout
    proc = subprocess.run(
        [sys.executable, "-m", "pipeline", *args], cwd=cwd, env=env, capture_output=True,
        text=True, timeout=300,
    )  # fmt: skip
    lines = (proc.stdout + proc.stderr).splitlines()
    assert proc.returncode == ExitCode.BAD_INPUT and len(lines) == 1, proc.stdout + proc.stderr
    assert lines[0].startswith("FAILED: ")
    return lines[0]


def run_local(root: Path, *args: str, env: dict[str, str] | None = None) -> str:
    """``run-local --root ROOT ARGS`` that fails at once: its line; nothing under `root`."""
    line = failed_line(["run-local", "--root", str(root), "--model", "small", *args], env=env)
    assert not root.exists(), "a refused run wrote its folder"
    return line


@pytest.mark.parametrize("uri", ["gs://my-bucket/x", "s3://b/x", "file:///tmp/x"])
def test_run_local_refuses_a_uri_root_by_name(uri: str, tmp_path: Path) -> None:
    line = failed_line(["run-local", "--root", uri], cwd=tmp_path)
    assert line == (
        "FAILED: --root must be a local folder (kfp.local writes the runs to local disk), got the "
        f"URI '{uri}'; a run can put its registry on GCS: --registry-root gs://..."
    )
    assert list(tmp_path.iterdir()) == [], "no folder named after the URI's scheme"


def test_run_local_help_says_root_is_a_local_folder() -> None:
    from click.testing import CliRunner

    from pipeline.cli import cli

    text = " ".join(CliRunner().invoke(cli, ["run-local", "--help"]).output.split())
    assert "--root TEXT the local folder where runs (and the registry, unless --registry-root) " \
        "go; not a URI" in text  # fmt: skip


def test_run_local_stops_on_a_missing_bucket_before_data_prep(
    gcs_emulator: str, gcs_bucket: str, tmp_path: Path
) -> None:
    missing = f"{gcs_bucket}-missing"
    line = run_local(tmp_path / "runs", "--registry-root", f"gs://{missing}/reg")
    assert line.startswith(
        f"FAILED: registry_root gs://{missing}/reg: bucket '{missing}' does not exist; create it"
    )
    assert bucket_objects(gcs_emulator, missing) is None


def test_run_local_stops_on_a_missing_data_bucket(gcs_bucket: str, tmp_path: Path) -> None:
    source = f"gs://{gcs_bucket}-missing/mnist.npz"
    line = run_local(tmp_path / "runs", "--data-source", source)
    assert line.startswith(f"FAILED: data_source {source}: bucket '{gcs_bucket}-missing' does")


def test_run_local_stops_on_a_registry_it_cannot_write(
    gcs_emulator: str, read_only_bucket: str, tmp_path: Path
) -> None:
    uri = f"gs://{read_only_bucket}/reg"
    line = run_local(tmp_path / "runs", "--registry-root", uri)
    assert line.startswith(f"FAILED: registry_root {uri}: {READ_ONLY} '{read_only_bucket}'")
    assert bucket_objects(gcs_emulator, read_only_bucket) == ["reg/kept.txt"]


def test_run_local_without_credentials_stops_before_data_prep(
    no_credentials: dict[str, str], tmp_path: Path
) -> None:
    line = run_local(tmp_path / "runs", "--registry-root", "gs://my-bucket/reg", env=no_credentials)
    assert line.startswith(f"FAILED: registry_root gs://my-bucket/reg: {NO_CREDENTIALS}")
    assert HOW in line and "Workload Identity" in line and "STORAGE_EMULATOR_HOST" in line


@pytest.mark.parametrize("command", ["render-inferenceservice", "sync-serving"])
def test_the_serving_commands_without_credentials_print_one_line(
    command: str, no_credentials: dict[str, str]
) -> None:
    line = failed_line([command, "--registry-root", "gs://my-bucket/models"], env=no_credentials)
    assert line.startswith(f"FAILED: --registry-root gs://my-bucket/models: {NO_CREDENTIALS}")
    assert HOW in line


@pytest.mark.parametrize("command", ["render-inferenceservice", "sync-serving"])
def test_the_serving_commands_name_a_missing_bucket(
    command: str, gcs_emulator: str, gcs_bucket: str
) -> None:
    missing = f"{gcs_bucket}-missing"
    line = failed_line([command, "--registry-root", f"gs://{missing}/models"])
    assert line.startswith(f"FAILED: --registry-root gs://{missing}/models: bucket '{missing}'")
    assert bucket_objects(gcs_emulator, missing) is None


def test_sync_serving_stops_on_a_registry_it_cannot_write(
    gcs_emulator: str, read_only_bucket: str
) -> None:
    uri = f"gs://{read_only_bucket}/reg"
    line = failed_line(["sync-serving", "--registry-root", uri])
    assert line.startswith(f"FAILED: --registry-root {uri}: {READ_ONLY} '{read_only_bucket}'")
    assert bucket_objects(gcs_emulator, read_only_bucket) == ["reg/kept.txt"]


def test_the_check_step_stops_a_run_on_a_missing_bucket(
    gcs_emulator: str, gcs_bucket: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The check step as KFP runs it (kfp.local runs its executor in a subprocess, which
    inherits the emulator's address): one FAILED line for the run, step 'check-parameters'."""
    import kfp.local

    from pipeline.check_component import make_component as make_check_component
    from pipeline.checks import PIPELINE_DEFAULTS

    missing = f"{gcs_bucket}-missing"
    values = {**PIPELINE_DEFAULTS, "registry_root": f"gs://{missing}/reg"}
    kfp.local.init(runner=kfp.local.SubprocessRunner(use_venv=False),
                   pipeline_root=str(tmp_path / "root"), raise_on_error=True)  # fmt: skip
    check = make_check_component(defaults.image_ref("data_prep"))
    with pytest.raises(local_run.RunFailed) as info, quiet_console(tmp_path / "run.log"):
        check(**values, images=defaults.image_refs())
    assert info.value.step == "check-parameters"
    assert info.value.reason.startswith(
        f"registry_root gs://{missing}/reg: bucket '{missing}' does not exist"
    )
    console = capsys.readouterr().out
    assert "Traceback" not in console and "Traceback" not in (tmp_path / "run.log").read_text()
    assert bucket_objects(gcs_emulator, missing) is None


# --- local folders: checked with the same rigour -----------------------------------------------


def test_a_local_folder_is_checked_by_a_probe_that_leaves_nothing(
    tmp_path: Path, read_only_folder: Path
) -> None:
    """A folder that exists, or can be made, passes, and is left as it was (nothing made, no
    probe left); one that cannot be written, or made, is refused in one line naming it."""
    from components.common.storage_access import StorageAccessError, check_local_folder

    (tmp_path / "exists").mkdir()
    check_local_folder("--root", tmp_path / "exists")
    check_local_folder("--root", tmp_path / "not" / "yet")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["exists", "read-only"]
    assert list((tmp_path / "exists").iterdir()) == []
    (tmp_path / "a-file").write_text("")
    for folder, said in [
        (read_only_folder, f"--root {read_only_folder}: this process cannot write there ("),
        (
            read_only_folder / "x",
            f"--root {read_only_folder / 'x'}: this process cannot write in "
            f"{read_only_folder}, where it would be made (",
        ),
        (tmp_path / "a-file", f"--root {tmp_path / 'a-file'}: is a file, not a folder"),
        (
            tmp_path / "a-file" / "x",
            f"--root {tmp_path / 'a-file' / 'x'}: cannot be made: "
            f"{tmp_path / 'a-file'} is a file, not a folder",
        ),
    ]:
        with pytest.raises(StorageAccessError) as info:
            check_local_folder("--root", folder)
        assert str(info.value).startswith(said), info.value
    assert list(read_only_folder.iterdir()) == []


@pytest.mark.parametrize("where", ["root", "registry"])
def test_run_local_stops_on_a_local_folder_it_cannot_write_before_data_prep(
    where: str, tmp_path: Path, read_only_folder: Path
) -> None:
    """A read-only ``--root`` (a traceback before) or ``--registry-root`` (a failed
    register step after training before): one line, before any step, nothing written."""
    if where == "root":
        root = read_only_folder / "runs"
        line = run_local(root)
        assert line.startswith(f"FAILED: --root {root}: this process cannot write in ")
    else:
        registry = read_only_folder / "registry"
        line = run_local(tmp_path / "runs", "--registry-root", str(registry))
        assert line.startswith(f"FAILED: registry_root {registry}: this process cannot write in ")
    assert list(read_only_folder.iterdir()) == []


def test_compile_refuses_an_output_it_cannot_write_in_one_line(
    tmp_path: Path, read_only_folder: Path
) -> None:
    (tmp_path / "a-file").write_text("")
    for output, said in [
        (tmp_path / "a-file" / "p.yaml", f"--output's folder {tmp_path / 'a-file'}: is a file"),
        (read_only_folder / "p.yaml", f"--output's folder {read_only_folder}: this process "),
        (tmp_path, f"--output {tmp_path} is a folder: name the YAML file to write"),
    ]:
        assert failed_line(["compile", "--output", str(output)]).startswith(f"FAILED: {said}")
    assert list(read_only_folder.iterdir()) == []
