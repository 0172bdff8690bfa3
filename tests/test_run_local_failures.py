"""A failed run ends in one line: ``FAILED: step '<name>': <reason>``, then the log's path.

Real runs: ``python -m pipeline run-local`` as a user types it (kfp.local, the steps as
subprocesses, a real 2-rank mpirun job), and the check step run by kfp.local as KFP runs its
executor. Each asserts the console's last lines, that no traceback reaches the console, and
that the reason is said once; the full output stays in the log the last line names.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from components.common import defaults

ROOT = Path(__file__).resolve().parents[1]


def run_local(tmp_path: Path, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "pipeline", "run-local", "--root", str(tmp_path), *args],
        cwd=ROOT, capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip


def assert_failed_in_one_line(
    proc: subprocess.CompletedProcess, step: str, reason: str, tmp_path: Path
) -> list[str]:
    """The run failed, ending with its FAILED line and the log's path; returns the console."""
    console = (proc.stdout + proc.stderr).splitlines()
    assert proc.returncode == 1, proc.stdout + proc.stderr
    failed, log = console[-2:]
    assert failed.startswith(f"FAILED: step '{step}': {reason}"), failed
    assert log.startswith(f"log: {tmp_path}/logs/run-local-") and Path(log[5:]).is_file()
    assert "Traceback" not in proc.stdout + proc.stderr
    assert sum(reason in line for line in console) == 1, console
    assert f"FAILED: {reason}" in Path(log[5:]).read_text()  # the step's own line, in the log
    return console


@pytest.mark.e2e
def test_a_missing_data_source_ends_run_local_with_one_failed_line(tmp_path: Path) -> None:
    proc = run_local(tmp_path, "--data-source", "/nonexistent/mnist.npz")
    console = assert_failed_in_one_line(
        proc, "prepare-data", "/nonexistent/mnist.npz: not found", tmp_path
    )
    assert len(console) <= 8, console  # the tasks' lines, the FAILED line, the log


@pytest.mark.e2e
@pytest.mark.horovod
def test_a_gpu_request_on_a_cpu_machine_is_refused_once_naming_each_library_once(
    tmp_path: Path,
) -> None:
    """Both ranks refuse; rank 0 says so once, and the FAILED line carries it: no per-rank
    copies, no copy with mpirun's tag."""
    proc = run_local(
        tmp_path, "--gpus-per-worker", "1", "--workers", "2", "--epochs", "1",
        "--data-limit", "200",
    )  # fmt: skip
    reason = (
        "2 of 2 ranks cannot train: this job asked for 1 GPU(s) per worker, but the trainer runs "
        "in a CPU image: TensorFlow cannot load libcudart.so.12, "
    )
    console = assert_failed_in_one_line(proc, "train", reason, tmp_path)
    text = "\n".join(console)
    assert text.count("libcudnn.so.9") == 1 and text.count("asked for 1 GPU(s)") == 1
    assert "<stdout>:" not in text and "cannot train:" not in text.replace(reason, "")


def test_a_refused_elastic_trainjob_fails_the_check_step_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Where a pipeline run refuses an elastic TrainJob today: the check step, run by kfp.local
    as KFP runs its executor (a subprocess of the compiled component; run-local itself has no
    backend to choose). The step prints ``FAILED: <reason>`` and exits without a traceback; the
    run's console ends with the step's name and that reason."""
    import kfp.local

    from pipeline.checks import PIPELINE_PARAMETERS
    from pipeline.local_run import RunFailed, quiet_console
    from pipeline.pipeline import make_check_component

    values: dict[str, Any] = {p.name: p.default for p in PIPELINE_PARAMETERS}
    values.update(training_backend="trainjob", min_workers=1, registry_root=str(tmp_path / "r"))
    kfp.local.init(
        runner=kfp.local.SubprocessRunner(use_venv=False),
        pipeline_root=str(tmp_path / "root"), raise_on_error=True,
    )  # fmt: skip
    check = make_check_component(defaults.image_ref("data_prep"))
    log = tmp_path / "run.log"
    with pytest.raises(RunFailed), quiet_console(log):
        check(**values, images=json.dumps(defaults.image_refs()))
    console = capsys.readouterr().out.splitlines()
    reason = (
        "invalid pipeline parameters: min_workers=1: elastic training needs mpi-operator's "
        "discover_hosts.sh, which Kubeflow Trainer v2 does not provide"
    )
    assert console[-2].startswith(f"FAILED: step 'check-parameters': {reason}"), console
    assert console[-1] == f"log: {log}"
    assert sum(reason in line for line in console) == 1
    assert "Traceback" not in log.read_text()  # an expected error: not even in the log
    assert f"FAILED: {reason}" in log.read_text()
