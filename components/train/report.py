"""The coordination report: a Markdown answer to "was it one model or N?"."""

from __future__ import annotations

from components.train.summary import RankRecord, RunSummary


def coordination_report(summary: RunSummary) -> str:
    """Render a run summary as the Markdown shown in the KFP UI next to the model."""
    size = summary["world_size"]
    fingerprints = sorted({r["weights_sha256"] for r in summary["per_rank"]})
    cov = summary["coverage"]
    lines = [
        "# Coordination report",
        "",
        f"**{size} workers formed ONE Horovod job and trained ONE model** "
        f"(formed by the {summary['controller']} controller; expected workers: "
        f"{summary['expected_workers']}; hosts: {', '.join(summary['hosts'])}).",
        "",
        *_backend_lines(summary),
        *_device_lines(summary),
        f"- Global batch: **{summary['global_batch_size']}** = {size} workers x "
        f"{summary['batch_size_per_worker']} per worker",
        f"- Learning rate: {_lr_text(summary)}, warmed up over {summary['warmup_epochs']} epoch(s)",
        *_model_lines(summary),
        f"- Epochs: {summary['epochs']}"
        + (
            f" (resumed after epoch {summary['resumed_from_epoch']})"
            if summary["resumed_from_epoch"]
            else ""
        ),
        f"- Every epoch saw {cov['seen_per_epoch']} of {cov['samples']} training samples: "
        f"shards disjoint **{cov['disjoint']}**, all covered **{cov['covers_all']}**",
        "",
        "## What each rank read and did",
        "",
        "| rank | host | device | threads | samples read | samples/epoch | steps/epoch "
        "| examples/s | weights sha256 |",
        "|---:|---|---|---:|---|---:|---:|---:|---|",
    ]
    for r in summary["per_rank"]:
        lo, hi = r["sample_range"]
        lines.append(
            f"| {r['rank']} | {r['host']} | {device_text(r)} | {r['threads']} | [{lo}, {hi}) | "
            f"{r['samples_per_epoch']} | {r['steps_per_epoch']} | {r['examples_per_second']} | "
            f"`{r['weights_sha256'][:16]}` |"
        )
    lines += ["", *_elastic_lines(summary), *resource_lines(summary)]
    return "\n".join([*lines, *_result_lines(summary, fingerprints)])


def _result_lines(summary: RunSummary, fingerprints: list[str]) -> list[str]:
    """The report's last section: one set of weights, one model, where it is."""
    size, identical = summary["world_size"], len(fingerprints) == 1
    metrics = ", ".join(f"{k} {v:.4f}" for k, v in sorted(summary["final_metrics"].items()))
    return [
        "## Result",
        "",
        (
            f"- Weights fingerprint: `{fingerprints[0][:16]}`, **identical on all {size} ranks**"
            if identical
            else f"- WARNING: ranks ended with {len(fingerprints)} different weight fingerprints"
        ),
        f"- Final training metrics (averaged over ranks): {metrics or 'n/a'}",
        f"- **1 model, exported by rank 0, at `{summary['model_uri']}`** "
        f"(saved_model.pb sha256 `{summary['saved_model_sha256'][:16]}`)",
        *(
            [f"- TensorBoard: `tensorboard --logdir {summary['tensorboard_uri']}`"]
            if summary.get("tensorboard_uri")
            else []
        ),
        "",
    ]


def _backend_lines(summary: RunSummary) -> list[str]:
    """Where the job ran (``training_backend``) and why, as the train step recorded it."""
    if not summary.get("training_backend"):
        return []
    reason = summary.get("training_backend_reason", "")
    return [f"- Backend: **{summary['training_backend']}**" + (f" ({reason})" if reason else "")]


def _lr_text(summary: RunSummary) -> str:
    """The learning rate and how the ``lr_scaling`` rule made it, in Markdown."""
    from components.train.optimizer import lr_formula

    rule = summary.get("lr_scaling", "linear")
    formula = lr_formula(rule, summary["base_learning_rate"], summary["world_size"])
    value, _, rest = formula.partition(" = ")
    if rule == "sqrt" and "adam" in summary:
        adam = summary["adam"]
        rest += (
            f", beta_1 {adam['beta_1']:g}, beta_2 {adam['beta_2']:g}, epsilon {adam['epsilon']:.2g}"
        )
    return f"**{value}** = {rest}"


def resource_lines(summary: RunSummary) -> list[str]:
    """The report's answer to "did the workers pay?": where a step's time went, per rank, and
    what to change (none for summaries without the measurement)."""
    use = summary.get("resource_use")
    if not use:
        return []
    lines = [
        "## Did the workers pay?",
        "",
        f"A step took {use['step_seconds'] * 1e3:.1f} ms: compute **{use['compute_share']:.0%}**, "
        f"communication **{use['communication_share']:.0%}**, waiting for slower ranks "
        f"**{use['waiting_share']:.0%}** (median of {use['epochs_measured']} epoch(s)). "
        f"Estimated scaling efficiency: **{use['estimated_efficiency']:.2f}**.",
        "",
        "| rank | host | step ms | compute ms | in allreduce ms | CPU cores busy | threads |",
        "|---:|---|---:|---:|---:|---:|---:|",
    ]
    for r in use["per_rank"]:
        lines.append(
            f"| {r['rank']} | {r['host']} | {r['step_ms']} | {r['compute_ms']} | "
            f"{r['allreduce_ms']} | {r['cpu_cores_busy']} | {r['threads']} |"
        )
    lines += ["", *(f"- {note}" for note in use["advice"]), ""]
    return lines


def paid_line(summary: RunSummary) -> str | None:
    """One line for a console: did the workers pay (None without the measurement)."""
    use = summary.get("resource_use")
    if not use:
        return None
    advice = f"; {use['advice'][0]}" if use["advice"] else ""
    return (
        f"paid: estimated scaling efficiency {use['estimated_efficiency']:.2f} (a step: compute "
        f"{use['compute_share']:.0%}, communication {use['communication_share']:.0%}, waiting "
        f"{use['waiting_share']:.0%}){advice}"
    )


def device_text(rank: RankRecord) -> str:
    """A rank's device in words: ``CPU``, or ``GPU:0 (NVIDIA H100 80GB HBM3, peak 1.2 GiB)``."""
    if "gpu_name" not in rank:
        return str(rank["device"])
    peak = rank["gpu_peak_memory_bytes"] / 2**30
    return f"{rank['device']} ({rank['gpu_name']}, peak {peak:.1f} GiB)"


def _device_lines(summary: RunSummary) -> list[str]:
    """How gradients were averaged: through host memory or GPU to GPU (NCCL)."""
    how = summary.get("gradient_allreduce")
    if how is None:
        return []
    words = {"nccl": "GPU to GPU (NCCL)", "host": "through host memory (Horovod's CPU operations)"}
    return [f"- Gradient allreduce: **{how}**, {words.get(how, how)}"]


def world_history(summary: RunSummary) -> str | None:
    """An elastic job's world sizes in words ("3 workers from epoch 1; 2 from epoch 4 (a
    worker was lost ...)"), or None for a static job."""
    elastic = summary.get("elastic")
    if not elastic:
        return None
    parts = []
    for i, entry in enumerate(elastic["world_size_history"]):
        why = "" if i == 0 else f" ({entry['why']}, {entry['when']})"
        parts.append(f"{entry['world_size']} workers from epoch {entry['epoch'] + 1}{why}")
    return (
        f"elastic job ({elastic['min_workers']} to {elastic['max_workers']} workers): "
        + "; then ".join(parts)
    )


def _elastic_lines(summary: RunSummary) -> list[str]:
    """The report's elastic section: the world-size history and each epoch's coverage."""
    history = world_history(summary)
    if history is None:
        return []
    lines = ["## Elastic training", "", f"- {history}", "", "| epoch | workers | samples seen "
             "| disjoint | all covered |", "|---:|---:|---:|---|---|"]  # fmt: skip
    for e in summary["elastic"]["epochs"]:
        lines.append(
            f"| {e['epoch']} | {e['world_size']} | {e['seen_per_epoch']} | {e['disjoint']} | "
            f"{e['covers_all']} |"
        )
    return [*lines, ""]


def _model_lines(summary: RunSummary) -> list[str]:
    """Which model was trained, its size, and whether augmented."""
    augment = "on (training only)" if summary["augment"] else "off"
    return [
        f"- Model: **{summary['model']}** ({summary['model_parameters']:,} parameters), "
        f"augmentation {augment}"
    ]
