"""The run summary: what one Horovod job did (`RunSummary`, embedding the `TrainConfig` it ran
with), written and read here only, and rendered here for people. Rank 0 writes it; the train
step's pod, the cluster run check, the reports, the registry and the benchmarks `read` it back.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any

from components.common import storage
from components.common.failure import InputError
from components.train.config import TrainConfig

# ``run_summary.json`` is ``dataclasses.asdict`` of a `RunSummary`. The coordination report
# (Markdown in the KFP UI) and the log's lines are made from it.
KIND = "kfp-horovod/run-summary/v1"
Record = dict[str, Any]
ALLREDUCE_TEXT = {
    "nccl": "GPU to GPU (NCCL)",
    "host": "through host memory (Horovod's CPU operations)",
}


@dataclass
class RunSummary:
    """One job's outcome, as `components.train.rank.telemetry.Telemetry.run_summary` gathers it;
    `elastic`: an elastic job's world sizes and every epoch's coverage; `training_backend` and
    its reason are the train step's."""

    config: TrainConfig
    world_size: int
    hosts: list[str]
    controller: str  # mpi (mpirun) or gloo (horovodrun)
    gradient_allreduce: str  # nccl or host
    resumed_from_epoch: int
    adam: dict[str, float]  # Adam's settings at this world size (lr_scaling)
    model_parameters: int
    dataset: Record  # uri, manifest_sha256, train_samples
    per_rank: list[Record]
    coverage: Record  # samples, seen_per_epoch, disjoint, covers_all (, epochs_checked)
    weights_identical_across_ranks: bool
    final_metrics: dict[str, float]
    # Checked in the run, not assumed: every rank's weights when training began (after rank 0's
    # broadcast), and every epoch's logged metrics against the mean of the ranks' own.
    start_weights_identical_across_ranks: bool = False
    metrics_averaged_across_ranks: bool = False
    saved_model_sha256: str = ""
    resource_use: Record | None = None
    elastic: Record | None = None
    training_backend: str = ""
    training_backend_reason: str = ""
    # a cluster job's deadline: "cluster" (its own deadline field) or "step" (the train step
    # deletes it; the cluster's CRD has no such field); empty for a local run
    deadline_enforced_by: str = ""
    kind: str = field(default=KIND)

    @property
    def global_batch_size(self) -> int:
        return self.config.batch_size_per_worker * self.world_size

    @property
    def model_uri(self) -> str:
        return self.config.model_uri


def to_json(summary: RunSummary) -> str:
    return json.dumps(dataclasses.asdict(summary), indent=2, sort_keys=True)


def parse(text: str) -> RunSummary:
    """A run summary from its JSON (ValueError if it is not one)."""
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise InputError(f"not valid JSON ({exc})") from exc
    if not isinstance(data, dict) or data.get("kind") != KIND:
        raise InputError(f"not a kfp-horovod run summary (expected a JSON object of kind {KIND})")
    try:
        return RunSummary(**{**data, "config": TrainConfig(**data["config"])})
    except (KeyError, TypeError, ValueError) as exc:
        raise InputError(f"not a kfp-horovod run summary ({exc})") from exc


def read(uri: str) -> RunSummary:
    """The run summary at `uri` (local path or ``gs://``); a ValueError names the URI."""
    try:
        return parse(storage.read_text(uri))
    except FileNotFoundError as exc:
        raise InputError(f"run summary {uri}: missing") from exc
    except IsADirectoryError as exc:
        raise InputError(f"run summary {uri}: is a directory, expected a JSON file") from exc
    except ValueError as exc:  # json.JSONDecodeError is a ValueError
        raise InputError(f"run summary {uri}: {exc}") from exc


def write(uri: str, summary: RunSummary) -> None:
    storage.write_text(uri, to_json(summary))


def lr_formula(rule: str, learning_rate: float, world_size: int, scaled: float) -> str:
    """The rule's learning rate in words, e.g. ``0.002 = 0.001 x 2 workers (linear)``."""
    factor = {"linear": f"x {world_size} workers", "sqrt": f"x sqrt({world_size} workers)"}
    how = factor.get(rule, f"for {world_size} workers")
    return f"{scaled:g} = {learning_rate:g} {how} ({rule})"


def device_text(rank: Record) -> str:
    """A rank's device in words: ``CPU``, or ``GPU:0 (NVIDIA H100 80GB HBM3, peak 1.2 GiB)``."""
    if "gpu_name" not in rank:
        return str(rank["device"])
    peak = rank["gpu_peak_memory_bytes"] / 2**30
    return f"{rank['device']} ({rank['gpu_name']}, peak {peak:.1f} GiB)"


def world_history(summary: RunSummary) -> str | None:
    """An elastic job's world sizes in words, or None for a static job."""
    elastic = summary.elastic
    if not elastic:
        return None
    parts = [
        f"{e['world_size']} workers from epoch {e['epoch'] + 1}"
        + ("" if i == 0 else f" ({e['why']}, {e['when']})")
        for i, e in enumerate(elastic["world_size_history"])
    ]
    return (
        f"elastic job ({elastic['min_workers']} to {elastic['max_workers']} workers): "
        + "; then ".join(parts)
    )


def paid_line(summary: RunSummary) -> str | None:
    """One line for a console: did the workers pay (None without the measurement)."""
    use = summary.resource_use
    if not use:
        return None
    advice = f"; {use['advice'][0]}" if use["advice"] else ""
    return (
        f"paid: estimated scaling efficiency {use['estimated_efficiency']:.2f} (a step: compute "
        f"{use['compute_share']:.0%}, communication {use['communication_share']:.0%}, waiting "
        f"{use['waiting_share']:.0%}, input {use.get('input_share', 0.0):.0%}){advice}"
    )


def coordination_lines(summary: RunSummary) -> list[str]:
    """The plain-words answer to 'one model or N?', for the log."""
    s, c = summary, summary.config
    lines = [
        f"{s.world_size} workers formed ONE job ({s.controller} controller) and trained ONE "
        f"model (weights identical on all ranks: {s.weights_identical_across_ranks}); "
        f"gradient allreduce {s.gradient_allreduce}.",
        f"checked in the run: weights identical on all ranks when training began: "
        f"{s.start_weights_identical_across_ranks}; every epoch's logged metrics the mean of "
        f"the ranks' own: {s.metrics_averaged_across_ranks}",
        f"model {c.model} ({s.model_parameters:,} parameters), augmentation "
        f"{'on' if c.augment else 'off'}",
    ]
    for r in s.per_rank:
        lo, hi = r["sample_range"]
        lines.append(
            f"  rank {r['rank']} on {r['host']} ({device_text(r)}, {r['threads']} threads): "
            f"samples [{lo}, {hi}) = {r['samples_per_epoch']} per epoch, "
            f"{r['steps_per_epoch']} steps per epoch, {r['examples_per_second']} examples/s"
        )
    cov = s.coverage
    lines.append(
        f"every epoch saw {cov['seen_per_epoch']} of {cov['samples']} samples "
        f"(disjoint: {cov['disjoint']}, all covered: {cov['covers_all']})"
    )
    history = world_history(s)
    return [
        *lines,
        *([history] if history else []),
        f"1 model, exported by rank 0, at {s.model_uri}",
    ]


def _row(*cells: Any) -> str:
    return "| " + " | ".join(str(c) for c in cells) + " |"


def coordination_report(summary: RunSummary) -> str:
    """Render a run summary as the Markdown shown in the KFP UI next to the model."""
    s, c, adam = summary, summary.config, summary.adam
    size, cov = s.world_size, s.coverage
    resumed = f" (resumed after epoch {s.resumed_from_epoch})" if s.resumed_from_epoch else ""
    reason = f" ({s.training_backend_reason})" if s.training_backend_reason else ""
    outcome = (
        "and trained ONE model"
        if s.weights_identical_across_ranks
        else "but their final weights differ: not one model"
    )
    formula = lr_formula(c.lr_scaling, c.learning_rate, size, adam["learning_rate"])
    lr, _, how = formula.partition(" = ")
    if c.lr_scaling == "sqrt":
        how += (
            f", beta_1 {adam['beta_1']:g}, beta_2 {adam['beta_2']:g}, epsilon {adam['epsilon']:.2g}"
        )
    lines = [
        "# Coordination report",
        "",
        f"**{size} workers formed ONE Horovod job {outcome}** (formed by the "
        f"{s.controller} controller; expected workers: {c.world_size}; hosts: "
        f"{', '.join(s.hosts)}).",
        "",
        *([f"- Backend: **{s.training_backend}**{reason}"] if s.training_backend else []),
        *(
            [f"- Deadline enforced by: **{s.deadline_enforced_by}**"]
            if s.deadline_enforced_by
            else []
        ),
        f"- Gradient allreduce: **{s.gradient_allreduce}**, "
        f"{ALLREDUCE_TEXT.get(s.gradient_allreduce, s.gradient_allreduce)}",
        f"- Global batch: **{s.global_batch_size}** = {size} workers x "
        f"{c.batch_size_per_worker} per worker",
        f"- Learning rate: **{lr}** = {how}, warmed up over {c.warmup_epochs} epoch(s)",
        f"- Model: **{c.model}** ({s.model_parameters:,} parameters), augmentation "
        f"{'on (training only)' if c.augment else 'off'}",
        f"- Epochs: {c.epochs}{resumed}",
        f"- Every epoch saw {cov['seen_per_epoch']} of {cov['samples']} training samples: "
        f"shards disjoint **{cov['disjoint']}**, all covered **{cov['covers_all']}**",
        "",
        "## What each rank read and did",
        "",
        _row(
            "rank",
            "host",
            "device",
            "threads",
            "samples read",
            "samples/epoch",
            "steps/epoch",
            "examples/s",
            "weights sha256",
        ),
        "|---:|---|---|---:|---|---:|---:|---:|---|",
    ]
    for r in s.per_rank:
        lo, hi = r["sample_range"]
        lines.append(
            _row(
                r["rank"],
                r["host"],
                device_text(r),
                r["threads"],
                f"[{lo}, {hi})",
                r["samples_per_epoch"],
                r["steps_per_epoch"],
                r["examples_per_second"],
                f"`{r['weights_sha256'][:16]}`",
            )
        )
    return "\n".join([*lines, "", *_elastic_lines(s), *resource_lines(s), *_result_lines(s)])


def _result_lines(s: RunSummary) -> list[str]:
    fingerprints = sorted({r["weights_sha256"] for r in s.per_rank})
    metrics = ", ".join(f"{k} {v:.4f}" for k, v in sorted(s.final_metrics.items()))
    weights = (
        f"- Weights fingerprint: `{fingerprints[0][:16]}`, **identical on all "
        f"{s.world_size} ranks**"
        if len(fingerprints) == 1
        else f"- WARNING: ranks ended with {len(fingerprints)} different weight fingerprints"
    )
    return [
        "## Result",
        "",
        weights,
        f"- Final training metrics (averaged over ranks): {metrics or 'n/a'}",
        f"- **1 model, exported by rank 0, at `{s.model_uri}`** "
        f"(saved_model.pb sha256 `{s.saved_model_sha256[:16]}`)",
        f"- TensorBoard: `tensorboard --logdir {s.config.tensorboard_uri}`",
        "",
    ]


def resource_lines(s: RunSummary) -> list[str]:
    """The report's answer to "did the workers pay?" (none without the measurement)."""
    use = s.resource_use
    if not use:
        return []
    lines = [
        "## Did the workers pay?",
        "",
        f"A step took {use['step_seconds'] * 1e3:.1f} ms: compute **{use['compute_share']:.0%}**, "
        f"communication **{use['communication_share']:.0%}**, waiting for slower ranks "
        f"**{use['waiting_share']:.0%}**, waiting for the input "
        f"**{use.get('input_share', 0.0):.0%}** (median of {use['epochs_measured']} epoch(s)). "
        f"Estimated scaling efficiency: **{use['estimated_efficiency']:.2f}**.",
        "",
        _row(
            "rank",
            "host",
            "step ms",
            "compute ms",
            "in allreduce ms",
            "input ms",
            "CPU cores busy",
            "threads",
        ),
        "|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    keys = (
        "rank",
        "host",
        "step_ms",
        "compute_ms",
        "allreduce_ms",
        "input_ms",
        "cpu_cores_busy",
        "threads",
    )
    lines += [_row(*(r[k] for k in keys)) for r in use["per_rank"]]
    return [*lines, "", *(f"- {note}" for note in use["advice"]), ""]


def _elastic_lines(s: RunSummary) -> list[str]:
    if not s.elastic:
        return []
    keys = ("epoch", "world_size", "seen_per_epoch", "disjoint", "covers_all")
    return [
        "## Elastic training",
        "",
        f"- {world_history(s)}",
        "",
        _row("epoch", "workers", "samples seen", "disjoint", "all covered"),
        "|---:|---:|---:|---|---|",
        *(_row(*(e[k] for k in keys)) for e in s.elastic["epochs"]),
        "",
    ]
