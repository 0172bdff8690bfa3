"""Shared pieces of the benchmarks: medians, the JSON record, datasets, running real jobs
(through `standins.commands`).

Every benchmark repeats its measurements, interleaving the variants it compares (A B A B ...)
so that drift on a shared machine hits all of them alike, and reports medians and ratios.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import platform
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import click
import numpy as np

from components.common import keras_env
from components.common.declare import run_command
from components.common.defaults import MODEL, SPLIT_SEED
from components.data_prep.prep import prepare
from components.train import summary
from components.train.config import TrainConfig, to_argv
from components.train.launcher.launch import YIELD_WHEN_IDLE, job_environment
from standins.commands import CommandResult, run_to_end, static_command

RESULTS_DIR = Path(__file__).with_name("results")
SCHEMA = "kfp-horovod/bench/v1"


def median(values: Sequence[float]) -> float:
    """The median of `values` (NaN for none)."""
    return float(statistics.median(values)) if values else float("nan")


def ratio(numerator: float, denominator: float) -> float:
    """``numerator / denominator`` rounded to 3 places (NaN if the denominator is not > 0)."""
    return round(numerator / denominator, 3) if denominator > 0 else float("nan")


def interleave(
    variants: Mapping[str, Callable[[int], dict[str, Any]]], repeats: int
) -> dict[str, list[dict[str, Any]]]:
    """Run every variant once per round, `repeats` rounds; return each variant's results.

    The order rotates each round (A B C, B C A, ...) so no variant always runs first.
    """
    names = list(variants)
    results: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
    for round_no in range(repeats):
        shift = round_no % len(names)
        for name in names[shift:] + names[:shift]:
            print(f"  [{name}] round {round_no + 1}/{repeats}", flush=True)
            results[name].append(variants[name](round_no))
    return results


def _cpu_model() -> str:
    """/proc/cpuinfo's model name (Linux, the one platform of this stack)."""
    models = re.findall(r"^model name\s*:\s*(.+)$", Path("/proc/cpuinfo").read_text(), re.M)
    return models[0].strip() if models else platform.processor() or "unknown"


def hardware_info() -> dict[str, Any]:
    """What the figures were measured on: CPU, cores, memory, versions."""
    import horovod

    tf = keras_env.tensorflow()

    cores = len(os.sched_getaffinity(0))  # Linux, the one platform of this stack
    memory_gib = round(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") / 2**30, 1)
    return {
        "cpu_model": _cpu_model(),
        "cores": cores,
        "memory_gib": memory_gib,
        "platform": platform.platform(),
        "python": platform.python_version(),
        "tensorflow": tf.__version__,
        "keras": keras_env.keras().__version__,
        "horovod": horovod.__version__,
        "numpy": np.__version__,
    }


SPIN = (
    "import time\nt=time.perf_counter()\nx=0\nfor i in range(N): x+=i\nprint(time.perf_counter()-t)"
)


def _spin(processes: int, loops: int) -> float:
    """Median seconds of a pure-Python loop when `processes` copies of it run at once."""
    code = SPIN.replace("N", str(loops))
    procs = [
        subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
        for _ in range(processes)
    ]
    return median([float(p.communicate()[0]) for p in procs])


# The capacity probe's size: loops per spin, and spins per median. `--quick` (bench_options)
# shrinks it to a tenth and one spin, since a smoke run's figures mean nothing anyway.
PROBE = {"loops": 5_000_000, "rounds": 3}
QUICK_PROBE = {"loops": 500_000, "rounds": 1}
# Other work using more than this many cores, sampled twice over SAMPLE_SECONDS while no job
# of the benchmark runs, and the machine is busy: its figures are not written. An idle machine
# here samples 0.0; one spinning process elsewhere, 1.0.
MAX_BUSY_CORES = 0.5
SAMPLE_SECONDS = 2.0
# Whether `machine_state` refuses a busy machine: off for `--quick` (its figures mean nothing).
REFUSE_BUSY = {"on": True}


class BusyMachine(SystemExit):
    """The machine is running other work: the benchmark stops, and writes nothing (exit 1, one
    line on stderr)."""


def cpu_parallel_capacity() -> dict[str, float]:
    """How many cores this machine gives *now*: 2 x t(1 loop) / t(2 loops at once).

    2.0 on two free cores; less when other work (or SMT siblings) shares them. Recorded with
    every result, because a scaling figure means little without it.
    """
    loops, rounds = PROBE["loops"], PROBE["rounds"]
    one = median([_spin(1, loops) for _ in range(rounds)])
    two = median([_spin(2, loops) for _ in range(rounds)])
    return {
        "one_process_seconds": round(one, 3),
        "two_processes_seconds": round(two, 3),
        "effective_cores_of_2": round(2 * one / two, 2),
    }


def machine_state() -> dict[str, Any]:
    """The 1, 5 and 15 minute load averages, the cores other work used just now (`busy_cores`)
    and the effective core count (see cpu_parallel_capacity).

    Every benchmark takes this before it starts and before it writes, while none of its jobs
    runs. Outside ``--quick`` it raises BusyMachine when other work used more than
    MAX_BUSY_CORES in two samples in a row."""
    refuse = REFUSE_BUSY["on"]
    busy = busy_cores(SAMPLE_SECONDS if refuse else 0.2)
    if refuse and busy > MAX_BUSY_CORES:
        busy = busy_cores()  # one sample can catch a passing blip
        if busy > MAX_BUSY_CORES:
            raise BusyMachine(busy_line(busy))
    return {
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "busy_cores": busy,
        "cpu_capacity": cpu_parallel_capacity(),
    }


def busy_cores(seconds: float = SAMPLE_SECONDS) -> float:
    """The cores this machine spent on anything but idle over `seconds`, from /proc/stat (the
    benchmark itself sleeps meanwhile, so this is other work)."""

    def sample() -> tuple[int, int]:
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n")[0].split()[1:]]
        return sum(fields), fields[3] + fields[4]  # all jiffies; idle + iowait

    (total0, idle0) = sample()
    time.sleep(seconds)
    (total1, idle1) = sample()
    share = 1 - (idle1 - idle0) / max(1, total1 - total0)
    return round(max(0.0, share) * (os.cpu_count() or 1), 2)


def busy_line(busy: float) -> str:
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    return (
        f"bench: the machine is busy: other work used {busy} cores (over {MAX_BUSY_CORES}), "
        f"load average {load}; no result written, rerun it on an idle machine"
    )


def finite(value: Any) -> Any:
    """`value` with every NaN or infinity replaced by None (null): strict JSON, which is what
    parsers other than Python's accept (a ratio without its reference run is not measured)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [finite(v) for v in value]
    return value


def write_result(name: str, result: dict[str, Any], out_dir: Path = RESULTS_DIR) -> Path:
    """Write ``out_dir/<name>.json`` with the hardware record added; return its path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    record = {"schema": SCHEMA, "benchmark": name, "hardware": hardware_info(), **result}
    record.setdefault("machine_after", machine_state())
    path = out_dir / f"{name}.json"
    path.write_text(json.dumps(finite(record), indent=2, sort_keys=True, allow_nan=False) + "\n")
    print(f"wrote {path}", flush=True)
    return path


# ---------------------------------------------------------------------------------------------
# Data


def augmented_digits(
    images: np.ndarray, labels: np.ndarray, count: int, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """`count` digits made by tiling `images` and shifting each by up to 2 pixels.

    Shifted copies of real digits are still valid, learnable MNIST-format samples; they are
    how the benchmarks get more data than the 5,000 real digits bundled offline.
    """
    rng = np.random.default_rng(seed)
    index = np.arange(count) % len(labels)
    x = images[index].copy()
    shifts = rng.integers(-2, 3, size=(count, 2))
    for dy in range(-2, 3):
        for dx in range(-2, 3):
            rows = np.flatnonzero((shifts[:, 0] == dy) & (shifts[:, 1] == dx))
            if len(rows) and (dy or dx):
                x[rows] = np.roll(x[rows], (dy, dx), axis=(1, 2))
    return x, labels[index].copy()


def write_mnist_npz(path: Path, train: int, test: int | None = None, seed: int = SPLIT_SEED) -> int:
    """Write an ``mnist.npz`` with `train` training samples; return its size in bytes.

    Training samples are augmented copies of the real *training* digits only; the test split
    is the 1,000 real held-out digits (or, if `test` is given, `test` augmented copies of them).
    """
    from components.data_prep.sources import bundled_digits

    splits = bundled_digits()  # the real bundled digits, split as data prep splits them
    x_train, y_train = augmented_digits(*splits["train"], train, seed)
    x_test, y_test = splits["test"]
    if test is not None:
        x_test, y_test = augmented_digits(x_test, y_test, test, seed + 1)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("wb") as f:
        np.savez(f, x_train=x_train, y_train=y_train, x_test=x_test, y_test=y_test)
    return path.stat().st_size


def bench_dataset(root: Path, train: int) -> str:
    """A prepared dataset (through the project's data prep) of `train` augmented real digits.

    Reused if already there. The test split is the 1,000 real held-out digits.
    """
    out = root / f"dataset-{train}"
    if (out / "manifest.json").exists():
        return str(out)
    npz = root / f"mnist-{train}.npz"
    write_mnist_npz(npz, train)
    prepare(str(npz), str(out), data_sha256="none")
    return str(out)


# ---------------------------------------------------------------------------------------------
# Running real jobs


def model_fields(model: str | None) -> dict[str, Any]:
    """The `TrainConfig` fields that select `model` (none for the trainer's default)."""
    return {} if model is None else {"model": model}


def model_option(func: Callable[..., Any]) -> Any:
    """``--model NAME`` (default: the trainer's default model)."""
    return click.option(
        "--model", default=None, help=f"model to train (default: the trainer's, {MODEL})"
    )(func)


Edit = tuple[tuple[str, ...], tuple[str, ...]]
# Open MPI's ranks spinning while they wait: the launcher's mpi_yield_when_idle taken out.
BUSY_WAIT: Edit = (YIELD_WHEN_IDLE, ())


def horovod_command(
    workers: int,
    module: str,
    args: list[str],
    controller: str = "mpi",
    edit: Edit | None = None,
    python: str | None = None,
) -> list[str]:
    """``python -m MODULE ARGS`` as one static job of `workers` local ranks (`static_command`:
    ``mpirun`` as the launcher starts the trainer, or ``horovodrun --gloo`` with `controller`
    ``gloo``). `edit` = (tokens, replacement): the launcher's command line
    with those consecutive tokens replaced (a benchmark's variant of it). `python`: another
    environment's interpreter (default this one's), running this checkout's code."""
    program = [python or sys.executable, "-m", module, *args]
    command = static_command(workers, program, controller)
    if edit is not None:
        old, new = edit
        at = next(i for i in range(len(command)) if tuple(command[i : i + len(old)]) == old)
        command[at : at + len(old)] = list(new)
    return command


def fresh(path: Path) -> Path:
    """`path`, emptied: benchmark outputs are scratch, and the trainer refuses to overwrite."""
    import shutil

    shutil.rmtree(path, ignore_errors=True)
    return path


def trainer_args(
    data: str, output: Path, workers: int, epochs: int, threads: int, **fields: Any
) -> list[str]:
    """Arguments of ``python -m components.train.rank`` for a benchmark run (in a fresh `output`).

    The trainer's own defaults apply (batch size, seed, ...) unless `fields` of `TrainConfig`
    override them (the model included: the trainer's default unless `fields` name another).
    """
    config = TrainConfig(
        data=data,
        output=str(fresh(output)),
        workers=workers,
        epochs=epochs,
        threads_per_worker=threads,
        **fields,
    )
    return to_argv(config)


def local_job_env(workers: int, env: dict[str, str] | None = None) -> dict[str, str]:
    """This process's environment, plus what the launcher gives a static job of `workers` local
    ranks (their ``HOROVOD_THREAD_AFFINITY``, as `make run` gets it), plus `env`."""
    return job_environment({**os.environ, **(env or {})}, local_ranks=workers)


def run_trainer(
    workers: int,
    args: list[str],
    env: dict[str, str] | None = None,
    controller: str = "mpi",
    edit: Edit | None = None,
    module: str | None = None,
    python: str | None = None,
) -> tuple[CommandResult, dict[str, Any]]:
    """Run the project's trainer (or `module`, a rank program wrapping it: `bench.variants`)
    as one Horovod job (see `horovod_command`). `env` is added to this process's environment.
    Returns the job and its run_summary."""
    job_env = local_job_env(workers, env)
    module = module or "components.train.rank"
    command = horovod_command(workers, module, args, controller, edit, python)
    result = run_to_end(command, job_env)
    output = Path(args[args.index("--output") + 1])
    return result, dataclasses.asdict(summary.read(str(output / "run_summary.json")))


def job_throughput(summary: dict[str, Any]) -> float:
    """Examples/s of the whole job after the first epoch: N x the slowest rank's rate.

    Ranks run in lockstep (every step ends in an allreduce), so the slowest rank's rate,
    times the number of ranks, is what the job delivers.
    """
    rates = [float(r["examples_per_second"]) for r in summary["per_rank"]]
    return len(rates) * min(rates)


def _quick(ctx: click.Context, param: click.Parameter, quick: bool) -> bool:
    """``--quick`` also shrinks the capacity probe (`QUICK_PROBE`) and runs on a busy machine."""
    if quick:
        PROBE.update(QUICK_PROBE)
        REFUSE_BUSY["on"] = False
    return quick


def bench_options(func: Callable[..., Any]) -> Any:
    """A click decorator: the options every benchmark has (``--out``, ``--work``, ``--repeats``,
    ``--quick``), its command's first four parameters."""
    options = [
        click.option(
            "--out",
            type=click.Path(file_okay=False, path_type=Path),
            default=RESULTS_DIR,
            show_default="bench/results",
            help="directory for <name>.json",
        ),
        click.option(
            "--work",
            type=click.Path(file_okay=False, path_type=Path),
            default=None,
            help="scratch directory (default: temp)",
        ),
        click.option(
            "--repeats",
            type=int,
            default=3,
            show_default=True,
            help="runs per variant (median reported)",
        ),
        click.option("--quick", is_flag=True, callback=_quick, help="tiny sizes (smoke test)"),
    ]
    for option in reversed(options):
        func = option(func)
    return func


def comma_ints(text: str) -> list[int]:
    """The whole numbers of comma-separated `text` (click's one line when one is not)."""
    try:
        return [int(item) for item in text.split(",")]
    except ValueError:
        raise click.BadParameter(f"not comma-separated whole numbers: {text!r}") from None


def comma_names(what: str, known: Sequence[str]) -> Callable[..., list[str]]:
    """A click callback: the names of comma-separated text, each one of `known` (click's one
    line naming the unknown ones when not)."""

    def parse(ctx: click.Context, param: click.Parameter, text: str) -> list[str]:
        names = [n for n in text.split(",") if n]
        if unknown := sorted(set(names) - set(known)):
            raise click.BadParameter(f"unknown {what} {unknown}; known: {', '.join(known)}")
        return names

    return parse


def bench_main(command: click.Command, argv: Sequence[str] | None, module: str) -> int:
    """Run benchmark `command` as ``python -m MODULE``: its exit code (a bad command line: click's
    usage and error lines, exit code 2)."""
    return int(run_command(command, argv, f"python -m {module}"))


def scratch(work: Path | None, name: str) -> Path:
    """A fresh scratch directory for benchmark `name`: under `work`, kept; or a new temp dir,
    removed when the process exits (a full `make bench` left about 11 GB in /tmp)."""
    import atexit
    import shutil
    import tempfile

    if work is None:
        path = Path(tempfile.mkdtemp(prefix=f"bench-{name}-"))
        atexit.register(shutil.rmtree, path, ignore_errors=True)
        return path
    path = (work / name).resolve()  # absolute: a job may run in another checkout (bench.stack)
    path.mkdir(parents=True, exist_ok=True)
    return path
