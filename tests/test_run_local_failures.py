"""``make run``'s console: the steps' own lines and the summary, everything else in the log; a
failed run ends in one line, ``FAILED: step '<name>': <reason>``, then the log's path.

`quiet_console` on what kfp.local prints, then real runs: ``python -m pipeline run-local`` as a
user types it (a real 2-rank mpirun job), and the check step run by kfp.local as KFP runs its
executor. Each asserts the console's last lines, no traceback there, and the reason said once.
"""

from __future__ import annotations

import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from components.common import defaults
from components.common.failure import ExitCode, InputError
from pipeline import local_run
from pipeline.local_run import quiet_console

ROOT = Path(__file__).resolve().parents[1]
LINES = [
    "00:46:58.341 - INFO - Executing task 'train'",
    '{"inputs": {"parameterValues": {"epochs": 8}}}',  # kfp.local's executor echo
    "    [1,0]<stdout>:[rank 0/2] Epoch 1/8 - loss 0.9843",
    "    [1,1]<stderr>:2026-12-04 00:46:59.1: I tensorflow/core/util/port.cc:153] oneDNN ...",
    "mpiwatch: watching 2 rank(s)",
    "    register: WARNING: mnist-cnn version 1 was registered with a test accuracy of 0.0000, ...",
]


def test_the_console_shows_the_steps_lines_and_the_log_keeps_everything(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = tmp_path / "logs" / "run.log"
    with quiet_console(log):
        print("\n".join(LINES))
        warnings.warn("You may be attemping to run a task that uses custom images", stacklevel=1)
    console = capsys.readouterr().out.splitlines()
    assert console == [LINES[0], "    [rank 0/2] Epoch 1/8 - loss 0.9843", *LINES[4:]]
    assert log.read_text().splitlines() == LINES


STEP = "\x1b[96m'list-data'\x1b[0m"  # kfp.local colours the task's name
STEP_FAILED = f"19:12:16.855 - ERROR - Task {STEP} finished with status FAILURE"
KFP_FAILED = RuntimeError(
    f"Pipeline 'kfp-horovod-mnist' finished with status FAILURE. Inner task failed: {STEP}."
)


@pytest.mark.parametrize(
    ("step_output", "finished", "error", "failed", "logged_traceback"),
    [
        (["FAILED: /nonexistent/mnist.npz: not found"], STEP_FAILED, KFP_FAILED,
         "FAILED: step 'list-data': /nonexistent/mnist.npz: not found", False),
        (["Traceback (most recent call last):", '  File "x.py", line 1, in <module>',
          "KeyError: 'splits'"], STEP_FAILED, KFP_FAILED,
         "FAILED: step 'list-data': KeyError: 'splits' (an unexpected error: its traceback "
         "is in the log)", True),
        ([], f"19:12:16.855 - INFO - Task {STEP} finished with status \x1b[92mSUCCESS\x1b[0m",
         OSError("docker daemon not running"), "FAILED: OSError: docker daemon not running", True),
    ],
    ids=["expected", "unexpected", "outside-any-step"],
)  # fmt: skip
def test_a_failed_run_ends_the_console_with_one_failed_line_and_the_log(
    step_output: list[str], finished: str, error: Exception, failed: str, logged_traceback: bool,
    tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    """What kfp.local prints of a step, then an exception: the console's last two lines are
    ``FAILED: step '<name>': <reason>`` (an error outside any step: its type and words) and the
    log's path; the log keeps everything, with the traceback of an error no step expected."""
    log = tmp_path / "run.log"
    with pytest.raises(local_run.RunFailed) as info, quiet_console(log):
        print(f"19:12:15.559 - INFO - Executing task {STEP}")
        print("\n".join("    " + line for line in step_output))
        print(finished)
        raise error
    console = capsys.readouterr().out.splitlines()
    assert console[-2:] == [failed, f"log: {log}"] and str(info.value) == failed
    assert "Traceback" not in "\n".join(console)
    assert all(line in log.read_text() for line in step_output)
    assert ("Traceback (most recent call last):" in log.read_text()) == logged_traceback


def failed_run_local(tmp_path: Path, *args: str) -> list[str]:
    """The console of ``python -m pipeline run-local`` that failed (`ExitCode.RUN_FAILED`)."""
    proc = subprocess.run(
        [sys.executable, "-m", "pipeline", "run-local", "--root", str(tmp_path), *args],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == ExitCode.RUN_FAILED, proc.stdout + proc.stderr
    return (proc.stdout + proc.stderr).splitlines()


def assert_failed_in_one_line(console: list[str], step: str, reason: str, log: str) -> None:
    """The console ends with the FAILED line and the path of the log (`log` its start), says the
    reason once and shows no traceback; the log has the step's own line."""
    failed, said_log = console[-2:]
    assert failed.startswith(f"FAILED: step '{step}': {reason}"), failed
    assert said_log.startswith(f"log: {log}") and Path(said_log[5:]).is_file()
    assert "Traceback" not in "\n".join(console)
    assert sum(reason in line for line in console) == 1, console
    assert f"FAILED: {reason}" in Path(said_log[5:]).read_text()


@pytest.mark.e2e
def test_a_missing_data_source_ends_run_local_with_one_failed_line(tmp_path: Path) -> None:
    console = failed_run_local(tmp_path, "--data-source", "/nonexistent/mnist.npz")
    reason, log = "/nonexistent/mnist.npz: not found", f"{tmp_path}/logs/run-local-"
    assert_failed_in_one_line(console, "list-data", reason, log)
    assert len(console) <= 8, console  # the tasks' lines, the FAILED line, the log


def refused_run_local(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> str:
    """The one line of ``run-local`` refused before any step (exit 2), nothing written."""
    root = tmp_path / "runs"
    proc = subprocess.run(
        [sys.executable, "-m", "pipeline", "run-local", "--root", str(root), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    lines = (proc.stdout + proc.stderr).splitlines()
    assert proc.returncode == ExitCode.BAD_INPUT and len(lines) == 1, lines
    assert not root.exists(), "a refused run wrote its folder"
    return lines[0]


def test_a_gpu_request_a_local_run_cannot_meet_is_refused_before_data_prep(tmp_path: Path) -> None:
    """One rank more than this machine has GPUs (none here): refused before data prep (it
    stopped in the train step after 39 s); with --runner docker, whose containers get none."""
    found = len([d for d in Path("/dev").iterdir() if local_run.NVIDIA_DEVICE.match(d.name)])
    line = refused_run_local(
        tmp_path, "--gpus-per-worker", "1", "--workers", str(found + 1), "--epochs", "1"
    )
    assert line == (
        f"FAILED: gpus_per_worker=1: a local run trains each of its {found + 1} ranks on a GPU of "
        f"its own, but this machine has {found} NVIDIA GPU(s) (/dev/nvidia<N>); use "
        "--gpus-per-worker 0 to train on the CPU, or a machine with a GPU per rank"
    )
    line = refused_run_local(tmp_path, "--gpus-per-worker", "1", "--runner", "docker")
    assert "--runner docker gives the steps' containers no GPU" in line, line


def test_gpus_are_counted_by_device_then_the_cuda_libraries_checked(tmp_path: Path) -> None:
    for n in range(2):
        (tmp_path / f"nvidia{n}").touch()
    (tmp_path / "nvidiactl").touch()  # not a GPU
    assert "this machine has 2 NVIDIA GPU(s)" in str(
        local_run.local_gpu_problem(1, 3, None, tmp_path)
    )
    assert local_run.local_gpu_problem(0, 3, None, tmp_path) is None
    from components.train.rank.cuda import missing_cuda_libraries

    found = local_run.local_gpu_problem(1, 2, None, tmp_path)
    if missing := missing_cuda_libraries():  # this environment: the CPU lock, no CUDA wheels
        assert found is not None and f"cannot load {', '.join(missing)}" in found
    else:
        assert found is None


def test_runner_docker_without_an_engine_is_refused_before_data_prep(tmp_path: Path) -> None:
    """The real Docker client with no engine at its address (the images' own check, against an
    engine, is tests/containers/test_pipeline_docker.py)."""
    env = {**os.environ, "DOCKER_HOST": f"unix://{tmp_path}/no-docker.sock"}
    line = refused_run_local(tmp_path, "--runner", "docker", env=env)
    assert line.startswith("FAILED: --runner docker: no Docker engine answers (")
    assert line.endswith(
        "start one (`make docker-ready`), then build the step images (`make images-local`)"
    )


@pytest.mark.horovod
def test_a_gpu_job_where_tensorflow_has_no_cuda_is_refused_by_rank_0_once(
    tmp_path: Path,
) -> None:
    """The train step's own check (a cluster's pod, a trainer image): both ranks refuse; rank 0
    says so once, in the job's error, with no per-rank copies and none with mpirun's tag."""
    from components.data_prep.prep import prepare
    from components.train.config import TrainConfig
    from components.train.launcher.launch import run_local_job

    prepare("bundled", str(tmp_path / "data"), data_limit=200)
    config = TrainConfig(
        data=str(tmp_path / "data"),
        output=str(tmp_path / "out"),
        workers=2,
        epochs=1,
        gpus_per_worker=1,
        model="small",
    )
    lines: list[str] = []
    with pytest.raises(InputError) as info:
        run_local_job(config, log=lines.append)
    reason = str(info.value)
    assert reason.startswith(
        "2 of 2 ranks cannot train: this job asked for 1 GPU(s) per worker, but the trainer runs "
        "in a CPU image: TensorFlow cannot load libcudart.so.12, "
    ), reason
    assert reason.count("libcudnn.so.9") == 1 and reason.count("asked for 1 GPU(s)") == 1
    text = "\n".join(lines)
    assert "asked for 1 GPU(s)" not in text and "cannot train:" not in text, text


def test_a_refused_elastic_trainjob_fails_the_check_step_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Where a pipeline run refuses an elastic TrainJob today: the check step, run by kfp.local
    as KFP runs its executor (a subprocess of the compiled component; run-local itself has no
    backend to choose). The step prints ``FAILED: <reason>`` and exits without a traceback; the
    run's console ends with the step's name and that reason."""
    import kfp.local

    from pipeline.check_component import make_component as make_check_component
    from pipeline.checks import PIPELINE_DEFAULTS

    values = {**PIPELINE_DEFAULTS, "training_backend": "trainjob", "min_workers": 1,
              "registry_root": str(tmp_path / "r")}  # fmt: skip
    kfp.local.init(
        runner=kfp.local.SubprocessRunner(use_venv=False),
        pipeline_root=str(tmp_path / "root"), raise_on_error=True,
    )  # fmt: skip
    check = make_check_component(defaults.image_ref("data_prep"))
    log = tmp_path / "run.log"
    with pytest.raises(local_run.RunFailed), quiet_console(log):
        check(**values, images=defaults.image_refs())
    reason = (
        "invalid pipeline parameters: min_workers=1: elastic training needs mpi-operator's "
        "discover_hosts.sh, which Kubeflow Trainer v2 does not provide"
    )
    console = capsys.readouterr().out.splitlines()
    assert_failed_in_one_line(console, "check-parameters", reason, str(log))
    assert console[-1] == f"log: {log}"
    assert "Traceback" not in log.read_text()  # an expected error: not even in the log
