"""The stack before and after issue 12, side by side: training throughput of the same trainer
command on TF 2.15.1 (Keras 2) and on TF 2.18.1 + tf-keras, 1x1 and 2x1, interleaved.

The bench harness runs everything under its own interpreter; this one takes one Python (a venv)
and one source tree per stack. Each run is ``horovodrun -np N --gloo python -m components.train``
(``launch.launcher_args``, with the args of ``launch.trainer_args``) using that venv's Python
and its own horovodrun (an older tree has no ``components.train.hvdrun``), in that tree. The
trees differ only in how they reach Keras (keras_env)::

    git archive 4a6b771 | tar -x -C /tmp/stack-before
    .venv-tf218/bin/python -m bench.stack \\
        --stack tf2.15.1=/work/main/.venv/bin/python:/tmp/stack-before \\
        --stack tf2.18.1=.venv-tf218/bin/python:.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
from pathlib import Path
from typing import Any

from bench.common import (
    base_parser,
    bench_dataset,
    fresh,
    interleave,
    job_throughput,
    machine_state,
    median,
    ratio,
    run_job,
    scratch,
    write_result,
)
from components.common import defaults
from components.train.config import TrainConfig, to_argv
from components.train.launch import launcher_args

NAME = "stack"


def stack_versions(python: str) -> dict[str, str]:
    """TensorFlow, Keras-for-Horovod and Horovod versions of the venv of `python`."""
    code = (
        "import json, importlib.metadata as md\n"
        "def v(d):\n"
        "    try: return md.version(d)\n"
        "    except md.PackageNotFoundError: return None\n"
        "print(json.dumps({d: v(d) for d in "
        "('tensorflow', 'tensorflow-cpu', 'keras', 'tf-keras', 'horovod', 'protobuf')}))"
    )
    out = subprocess.run([python, "-c", code], capture_output=True, text=True, check=True)
    return {k: v for k, v in json.loads(out.stdout).items() if v}


def stack_command(python: str, workers: int, args: list[str]) -> list[str]:
    """The project's trainer command, with this stack's Python and its own horovodrun."""
    program = [python, "-m", "components.train", *args]
    return [str(Path(python).parent / "horovodrun"), *launcher_args(workers), *program]


def tree_argv(tree: Path, config: TrainConfig) -> list[str]:
    """`config` as arguments of the trainer in `tree`. A tree from before the model choice has
    no ``--model`` (its argparse would read it as ``--model-dir``) and trains only the small
    CNN, so the flag is left out there; `config.model` must then be ``small``."""
    argv = to_argv(config)
    if '"--model"' in (tree / "components" / "train" / "config.py").read_text():
        return argv
    if config.model != "small":
        raise ValueError(f"{tree} predates --model: it can only train small, not {config.model}")
    at = argv.index("--model")
    return argv[:at] + argv[at + 2 :]


def measure(
    python: str, tree: Path, data: str, work: Path, label: str, workers: int, epochs: int,
    round_no: int,
) -> dict[str, Any]:  # fmt: skip
    """One training run of this stack at `workers` x 1 thread; its job throughput."""
    output = fresh(work / f"{label}-{workers}x1-r{round_no}")
    config = TrainConfig(
        data=data, output=str(output), workers=workers, epochs=epochs,
        batch_size_per_worker=defaults.BATCH_SIZE_PER_WORKER, threads_per_worker=1,
        seed=defaults.SHUFFLE_SEED, model="small",
    )  # fmt: skip
    env = dict(os.environ, PYTHONPATH=str(tree.resolve()))
    env.pop("TF_USE_LEGACY_KERAS", None)  # each tree selects its Keras itself
    previous = Path.cwd()
    os.chdir(tree)  # the ranks run `python -m components.train` from this tree
    try:
        job = run_job(stack_command(python, workers, tree_argv(tree, config)), env)
    finally:
        os.chdir(previous)
    summary = json.loads((output / "run_summary.json").read_text())
    return {
        "examples_per_second": job_throughput(summary),
        "wall_seconds": round(job.wall_seconds, 2),
        "final_accuracy": summary["final_metrics"].get("accuracy"),
        "weights_identical_across_ranks": summary["weights_identical_across_ranks"],
    }


def run(
    stacks: dict[str, tuple[str, Path]], train_samples: int, epochs: int, repeats: int, work: Path
) -> dict[str, Any]:
    """Every stack at 1x1 and 2x1, `repeats` rounds interleaved; medians and after/before."""
    data = bench_dataset(work, train_samples)
    machine_before = machine_state()
    variants = {
        f"{label} {workers}x1": functools.partial(
            measure, python, tree, data, work, label, workers, epochs
        )
        for workers in (1, 2)
        for label, (python, tree) in stacks.items()
    }
    runs = interleave(variants, repeats)
    medians = {name: median([r["examples_per_second"] for r in rs]) for name, rs in runs.items()}
    before, after = list(stacks)[:2]
    return {
        "settings": {
            "stacks": {
                label: {"python": python, "tree": str(tree), **stack_versions(python)}
                for label, (python, tree) in stacks.items()
            },
            "layouts": ["1x1", "2x1"],
            "train_samples": train_samples,
            "epochs": epochs,
            "repeats": repeats,
            "batch_size_per_worker": 64,
            "throughput": "examples/s of the whole job, median epoch after the first",
            "machine": "shared: other engineers' jobs ran on the same 2 cores",
        },
        "machine_before": machine_before,
        "runs": runs,
        "median_examples_per_second": medians,
        "ratios": {
            f"{after}_over_{before}_{n}x1": ratio(
                medians[f"{after} {n}x1"], medians[f"{before} {n}x1"]
            )
            for n in (1, 2)
        },
        "machine_after": machine_state(),
    }


def main(argv: list[str] | None = None) -> int:
    """CLI: ``python -m bench.stack --stack LABEL=PYTHON:TREE --stack LABEL=PYTHON:TREE``."""
    p = base_parser(__doc__ or NAME)
    p.add_argument("--stack", action="append", required=True, help="LABEL=PYTHON:TREE, twice")
    p.add_argument("--train-samples", type=int, default=20000)
    p.add_argument("--epochs", type=int, default=4, help="the first one is not timed")
    a = p.parse_args(argv)
    stacks: dict[str, tuple[str, Path]] = {}
    for spec in a.stack:
        label, _, rest = spec.partition("=")
        python, _, tree = rest.partition(":")
        stacks[label] = (str(Path(python).absolute()), Path(tree or ".").resolve())
    if len(stacks) != 2:
        p.error("give exactly two --stack: before, then after")
    if a.quick:
        a.train_samples, a.epochs, a.repeats = 2000, 2, 1
    work = scratch(a.work.resolve() if a.work else None, NAME)
    result = run(stacks, a.train_samples, a.epochs, a.repeats, work)
    print(json.dumps(result["median_examples_per_second"], indent=2))
    print(json.dumps(result["ratios"], indent=2))
    write_result(NAME, result, a.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
