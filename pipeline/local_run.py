"""The whole pipeline on this machine with ``kfp.local`` (``python -m pipeline run-local``,
``make run``): each step a subprocess (or a container), training under mpirun on localhost
(elastic horovodrun where ``min_workers`` > 0), local disk for GCS; a quiet console. Runs in the
pipeline's CLI process.
"""

from __future__ import annotations

import builtins
import contextlib
import io
import json
import os
import re
import sys
import threading
import time
import traceback
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from components.common import defaults, failure, processes, storage_access
from components.common.defaults import PIPELINE_NAME
from components.common.failure import ExitCode, ExpectedError, InputError
from components.train.launcher.preflight import check_model_before_launch
from components.train.summary import paid_line, world_history
from components.train.summary import read as read_summary
from pipeline.checks import PIPELINE_DEFAULTS, check_parameters_step
from pipeline.pipeline import build_pipeline


@dataclass
class LocalRun:
    """Where a local run put everything, read back from its executor outputs."""

    run_dir: Path
    outputs: dict[str, dict[str, Any]] = field(default_factory=dict)
    wall_seconds: float = 0.0
    log: Path | None = None  # everything kfp.local and the steps printed

    def artifact(self, task: str, name: str) -> str:
        return str(self.outputs[task]["artifacts"][name]["artifacts"][0]["uri"])

    def parameter(self, task: str, name: str) -> Any:
        return self.outputs[task]["parameterValues"][name]

    def report_lines(self) -> list[str]:
        """The end-of-run summary. Scripts rely on the ``run_summary: <path>`` line."""
        accuracy, loss = self.parameter("evaluate", "accuracy"), self.parameter("evaluate", "loss")
        summary_path = self.artifact("train", "run_summary")  # the trainer's run_summary.json
        summary = read_summary(summary_path)
        return [
            f"run: {self.run_dir}",
            f"log: {self.log}",
            f"dataset: {self.artifact('publish-dataset', 'dataset')}",
            f"model: {self.artifact('train', 'saved_model')}",
            f"run_summary: {summary_path}",
            f"coordination_report: {self.artifact('train', 'coordination_report')}",
            f"metrics: accuracy {accuracy:.4f}, loss {loss:.4f} "
            f"({self.artifact('evaluate', 'metrics')})",
            f"confusion_matrix: {self.artifact('evaluate', 'confusion_matrix')}",
            f"evaluation_report: {self.artifact('evaluate', 'report')}",
            f"registry_entry: {self.parameter('register-model', 'version_uri') or '(none)'}",
            f"decision: {self.parameter('register-model', 'decision_text')}",
            f"workers: {summary.world_size} formed ONE job "
            f"({summary.controller} controller); 1 model, exported by rank 0 "
            f"(weights identical on all ranks: {summary.weights_identical_across_ranks})",
            *([history] if (history := world_history(summary)) else []),
            *([paid] if (paid := paid_line(summary)) else []),
        ]


def run_pipeline_locally(
    root: str | Path = "runs",
    docker_images: tuple[str, str] | None = None,
    stop: RunStop | None = None,
    **params: Any,
) -> LocalRun:
    """Run the pipeline with kfp.local under `root`; return where everything went.

    `root` is a local folder (a URI is refused: kfp.local writes to local disk). `params` are
    pipeline parameters, checked before anything runs, their ``gs://`` locations included
    (``registry_root`` defaults to ``<root>/registry``, ``training_backend`` to ``local``: the
    compiled default, ``auto``, needs a cluster). With `docker_images` = ``(registry, tag)``
    every step runs in its image (``DockerRunner``, the train step building the ``model``
    there), else in this environment. A stop under `failure.stops_on_signals(stop)` ends every
    process the run started (`RunStop`) and the run with one ``STOPPED:`` line.
    """
    import kfp.local

    if URI.match(str(root)):
        raise InputError(
            f"--root must be a local folder (kfp.local writes the runs to local disk), got the URI "
            f"{str(root)!r}; a run can put its registry on GCS: --registry-root gs://..."
        )
    storage_access.check([storage_access.Location("--root", str(root), writes=True)])
    root = Path(root).resolve()
    pipeline_root = root / "pipeline-root"
    default_registry = (pipeline_root if docker_images else root) / "registry"
    params.setdefault("registry_root", str(default_registry))
    params.setdefault("training_backend", "local")
    images = defaults.image_refs(*(docker_images or ()))
    # The check step, run here before anything else: kfp.local runs each task in its compiled
    # image, so the trainer's is chosen now (build_pipeline's image_at_run_time).
    values = PIPELINE_DEFAULTS | params
    images["trainer"] = check_parameters_step(images, **values).trainer_image
    if params["training_backend"] != "local":
        raise InputError(
            f"training_backend must be 'local' for a local run (no cluster here), got "
            f"{params['training_backend']!r}: 'auto', 'mpijob' and 'trainjob' run on a Kubeflow "
            "cluster (docs/operating.md)"
        )
    if problem := local_gpu_problem(values["gpus_per_worker"], values["workers"], docker_images):
        raise InputError(problem)  # before data prep, not in the train step
    if docker_images:
        check_local_images([images[name] for name in STEP_IMAGES])
    else:
        check_model_before_launch(values["model"])
    pipeline_root.mkdir(parents=True, exist_ok=True)
    if docker_images:
        _share_with_image_user(pipeline_root, Path(params["registry_root"]))
    before = set(pipeline_root.iterdir())
    runner = (
        kfp.local.DockerRunner() if docker_images else kfp.local.SubprocessRunner(use_venv=False)
    )
    kfp.local.init(runner=runner, pipeline_root=str(pipeline_root), raise_on_error=True)
    pipeline_func = build_pipeline(images, image_at_run_time=False)
    started = time.monotonic()
    log = root / "logs" / time.strftime("run-local-%Y%m%d-%H%M%S.log")
    with quiet_console(log, stop), own_print():
        pipeline_func(**params)
    runs = [p for p in set(pipeline_root.iterdir()) - before if p.name.startswith(PIPELINE_NAME)]
    if len(runs) != 1:
        raise RuntimeError(f"expected one new run under {pipeline_root}, found {len(runs)}")
    outputs = {
        f.parent.name: json.loads(f.read_text()) for f in runs[0].glob("*/executor_output.json")
    }
    return LocalRun(runs[0], outputs, time.monotonic() - started, log)


# The images a run with --runner docker runs its steps in (`images` after the check step's choice
# of the trainer's: the check step runs in data prep's).
STEP_IMAGES = ("data_prep", "trainer", "evaluate", "register")
NVIDIA_DEVICE = re.compile(r"^nvidia\d+$")  # /dev/nvidia0, ...: a GPU the driver exposes


def local_gpu_problem(
    gpus_per_worker: int,
    workers: int,
    docker_images: tuple[str, str] | None,
    dev: Path = Path("/dev"),
) -> str | None:
    """Why a local run asking for GPUs cannot train here (every rank on a GPU of its own, one of
    the ``nvidia<N>`` devices in `dev`), or None: checked before data prep (it stopped the train
    step after 39 s)."""
    if gpus_per_worker <= 0:
        return None
    asked = (
        f"gpus_per_worker={gpus_per_worker}: a local run trains each of its {workers} ranks on "
        "a GPU of its own"
    )
    if docker_images:
        return (
            f"{asked}, but --runner docker gives the steps' containers no GPU (kfp.local's "
            "DockerRunner); use --runner subprocess on a machine with GPUs, or "
            "--gpus-per-worker 0 to train on the CPU"
        )
    found = sum(1 for d in dev.iterdir() if NVIDIA_DEVICE.match(d.name)) if dev.is_dir() else 0
    if found < workers:
        return (
            f"{asked}, but this machine has {found} NVIDIA GPU(s) (/dev/nvidia<N>); use "
            "--gpus-per-worker 0 to train on the CPU, or a machine with a GPU per rank"
        )
    from components.train.rank.cuda import missing_cuda_libraries

    if missing := missing_cuda_libraries():
        return (
            f"{asked}, but this environment's TensorFlow cannot load {', '.join(missing)} (the "
            "CUDA libraries of tensorflow[and-cuda], requirements/lock-cuda.txt); install them, "
            "or use --gpus-per-worker 0"
        )
    return None


def check_local_images(refs: list[str]) -> None:
    """InputError, one line, unless a Docker engine answers and holds every image of `refs`
    (a missing one failed after data prep with Docker's raw APIError), naming the target that
    builds them."""
    import docker

    try:
        client = docker.from_env()
        client.ping()
    except docker.errors.DockerException as exc:
        raise InputError(
            f"--runner docker: no Docker engine answers ({failure.reason(exc)}); start one "
            "(`make docker-ready`), then build the step images (`make images-local`)"
        ) from None
    missing = []
    for ref in dict.fromkeys(refs):
        try:
            client.images.get(ref)
        except docker.errors.ImageNotFound:
            missing.append(ref)
    if missing:
        raise InputError(
            f"--runner docker: no image {', '.join(missing)} on this machine's Docker engine; "
            "build the step images with `make images-local` (LOCAL_TAG=<tag> for --image-tag "
            "<tag>)"
        )


# A URI (``gs://``, any ``scheme://``), which `run_pipeline_locally`'s root may not be.
URI = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")
# What a run prints to the console: kfp.local's task lines, what the trainer's ranks and
# launcher say (rank-tagged lines, the launcher's watch) and the register step's warning.
# Everything goes to the log file.
SHOWN = re.compile(
    r"Executing task|finished with status|\[rank \d+/\d+\]|launcher: |mpiwatch: |register: "
)
# mpirun's tag on each line of a rank (``[1,0]<stdout>:``): the console has the rank's own tag.
MPI_TAG = re.compile(r"\[\d+,\d+\]<std(out|err)>:")
# kfp.local's warning about running components outside their images: that is the point of a
# local run (SubprocessRunner), so it is not shown.
HARMLESS_WARNING = "You may be attemping to run a task that uses custom"
# kfp.local's line starting a task (its name in colour), and the colour codes.
TASK_STARTS = re.compile(r"Executing task '([^']+)'")
TASK_SUCCEEDED = re.compile(r"Task '[^']+' finished with status SUCCESS")
COLOUR = re.compile(r"\x1b\[[0-9;]*m")
TRACEBACK = "Traceback (most recent call last):"


# How long a stopped run waits for its steps to end their work themselves (each ends its Horovod job
# at once: `components.train.launcher.mpiwatch.watch`) before it SIGKILLs every process it started.
STOP_GRACE_S = 10.0


class RunStop:
    """What a stop (SIGTERM, Ctrl-C) of run-local does to the processes the run started: in the
    signal handler (`__call__`) it notes them all and passes the signal on to those in its own
    process group, as Ctrl-C does (the steps and their shells: each step ends its own job); a
    thread SIGKILLs whatever of them still runs `grace_s` later. `finish` waits for that and
    says what was ended. So everything the run started is gone within `grace_s` of the signal
    (plus a poll)."""

    def __init__(self, grace_s: float = STOP_GRACE_S) -> None:
        self.grace_s = grace_s
        self.started = processes.Started()
        self.killed: list[str] = []
        self.signalled = 0.0
        self._reaper: threading.Thread | None = None

    def __call__(self, stop: failure.Stopped) -> None:
        import psutil

        self.signalled = time.monotonic()
        self.started.note()
        group = os.getpgrp()
        for proc in self.started.running():  # as Ctrl-C reaches them: the steps, their shells
            with contextlib.suppress(psutil.Error, OSError):
                if os.getpgid(proc.pid) == group:  # not mpirun's own session
                    proc.send_signal(stop.signum)
        self._reaper = threading.Thread(target=self._reap, daemon=True, name="run-stop")
        self._reaper.start()

    def _reap(self) -> None:
        if not self.started.wait(self.grace_s):
            self.killed = self.started.kill()

    def finish(self, step: str = "") -> str:
        """What the stop ended, once all of it has ended (or `grace_s` has passed)."""
        if self._reaper is None:
            return "no step had started"
        self._reaper.join(self.grace_s + 5)
        took = time.monotonic() - self.signalled
        said = f"step {step!r} stopped; " if step else ""
        said += f"ended the {self.started.describe()} the run had started, in {took:.1f} s"
        if self.killed:
            said += f" ({processes.names(self.killed)} SIGKILLed after {self.grace_s:g} s)"
        if left := self.started.running():
            return said + f"; STILL RUNNING: pids {', '.join(str(p.pid) for p in left)}"
        return said + "; none is left"


class RunFailed(ExpectedError):
    """A local run stopped: `step` (or '' before any step) failed with `reason`; `log` holds
    everything it printed."""

    exit_code = ExitCode.RUN_FAILED

    def __init__(self, step: str, reason: str, log: Path) -> None:
        self.step, self.reason, self.log = step, reason, log
        super().__init__(f"FAILED: step {step!r}: {reason}" if step else f"FAILED: {reason}")


class _Tee(io.TextIOBase):
    """Every line to `log`, the lines `SHOWN` matches also to `console`; keeps which task runs and
    how it said it failed: its ``FAILED:`` line, else its traceback's last line."""

    def __init__(self, log: TextIO, console: TextIO) -> None:
        self.log, self.console, self.pending = log, console, ""
        self.task, self.failed, self.exception = "", "", ""
        self.traceback_indent: int | None = None  # inside a traceback: its first line's indent

    def write(self, text: str) -> int:
        self.log.write(text)
        self.pending += text
        *lines, self.pending = self.pending.split("\n")
        for line in lines:
            self._read(COLOUR.sub("", line))
            if SHOWN.search(line):
                self.console.write(MPI_TAG.sub("", line, count=1) + "\n")
        return len(text)

    def _read(self, line: str) -> None:
        text, indent = line.lstrip(), len(line) - len(line.lstrip())
        if started := TASK_STARTS.search(line):
            self.task, self.failed, self.exception = started.group(1), "", ""
        elif TASK_SUCCEEDED.search(line):  # what fails later is not this task's doing
            self.task = ""
        elif text.startswith(failure.FAILED):
            self.failed = text[len(failure.FAILED) :]
        elif text.startswith(failure.STOPPED):  # the step was stopped, not by this run
            self.failed = "stopped by " + text[len(failure.STOPPED) :]
        elif text == TRACEBACK:
            self.traceback_indent = indent
        elif self.traceback_indent == indent and text:  # a traceback's last line: the error
            self.exception, self.traceback_indent = text, None

    def reason(self, exc: BaseException) -> str:
        """Why the run stopped: the task's own words, else `exc` (an error of the run itself)."""
        if self.task and self.failed:
            return self.failed
        if self.task and self.exception:
            return f"{self.exception} (an unexpected error: its traceback is in the log)"
        return f"{type(exc).__name__}: {failure.reason(exc)}"

    def flush(self) -> None:
        self.log.flush()
        self.console.flush()


@contextlib.contextmanager
def own_print() -> Iterator[None]:
    """This process's ``print`` back after the block: kfp.local's ParallelFor threads each put
    an indenting ``builtins.print`` in place and restore the one they found, so two at once can
    leave an indenting one behind (kfp 2.17.3, ``logging_utils.indented_print``)."""
    found = builtins.print
    try:
        yield
    finally:
        builtins.print = found


@contextlib.contextmanager
def quiet_console(log_path: Path, stop: RunStop | None = None) -> Iterator[None]:
    """Everything printed to `log_path`, only `SHOWN` lines to the console; on failure the
    console ends with ``FAILED: step '<name>': <reason>`` and the log's path, and `RunFailed`
    is raised (the traceback goes to the log); on a stop, with the ``STOPPED:`` line naming the
    step and what `stop` ended, and the log's path (exit 128 + N)."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    console = sys.stdout
    with log_path.open("w") as log, warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=HARMLESS_WARNING)
        tee = _Tee(log, console)
        try:
            with contextlib.redirect_stdout(tee), contextlib.redirect_stderr(tee):
                yield
        except failure.Stopped as stopped:
            stopped.ended.append((stop or RunStop()).finish(tee.task))
            log.write(f"{stopped.line()}\n")
            log.flush()
            console.write(f"{stopped.line()}\nlog: {log_path}\n")
            raise SystemExit(stopped.exit_code) from None
        except Exception as exc:
            if not (tee.task and tee.failed):  # not a step's expected error: how it came about
                traceback.print_exc(file=log)
            log.flush()
            failed = RunFailed(tee.task, tee.reason(exc), log_path)
            console.write(f"{failed}\nlog: {log_path}\n")
            raise failed from exc
        except BaseException:
            log.flush()
            console.write(f"log: {log_path}\n")
            raise


def _share_with_image_user(pipeline_root: Path, registry_root: Path) -> None:
    """DockerRunner mounts only the pipeline root, and the images run as uid 1000: the registry
    must be inside the pipeline root, and both writable by that user."""
    registry_root = registry_root.resolve()
    if not registry_root.is_relative_to(pipeline_root):
        raise InputError(
            f"registry_root must be inside the pipeline root {pipeline_root} with --runner "
            f"docker (DockerRunner mounts only that folder into the steps), got {registry_root}"
        )
    registry_root.mkdir(parents=True, exist_ok=True)
    for folder in (pipeline_root, registry_root):
        folder.chmod(0o777)
