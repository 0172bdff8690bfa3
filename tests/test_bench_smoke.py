"""Smoke test of the benchmarks: each runs at tiny sizes and writes valid JSON. No timings.

The arithmetic (layouts, the levers' and the step profile's figures, pinning) runs in
``make test-fast`` and ``make test``. Everything that starts real Horovod jobs is marked
``horovod`` and ``bench``, and runs in ``make test-bench`` (which ``.ci/run`` runs): the module's
`results` (data prep, one scaling layout, the 2-rank allreduce sizes, the report) and the
benchmarks that need several jobs (MWMS, time to accuracy, the whole pipeline, the allreduce
timeline, two levers jobs and a profiled one).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from bench import (
    allreduce,
    data_prep,
    faults,
    levers,
    mwms,
    pipeline_overhead,
    scaling,
    stack,
    step_profile,
    time_to_accuracy,
)
from bench.common import machine_state, write_result
from bench.report import write_report
from tests.conftest import LOCAL_RUN_FLAGS, LocalRun


def _read(out: Path, name: str) -> dict[str, Any]:
    record = json.loads((out / f"{name}.json").read_text())
    assert record["schema"] == "kfp-horovod/bench/v1"
    assert record["benchmark"] == name
    assert record["hardware"]["cores"] >= 1
    assert "effective_cores_of_2" in record["machine_after"]["cpu_capacity"]
    return record


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The fast benchmarks' results, written once for this module."""
    root = tmp_path_factory.mktemp("bench")
    out, work = root / "results", root / "work"
    common = ["--quick", "--out", str(out), "--work", str(work)]
    assert data_prep.main(common) == 0
    assert scaling.main([*common, "--layouts", "1x1"]) == 0
    assert allreduce.main([*common, "--no-timeline"]) == 0
    return out


@pytest.mark.horovod
@pytest.mark.bench
def test_data_prep_writes_rows_and_fit(results: Path) -> None:
    record = _read(results, "data_prep")
    assert [r["train_samples"] for r in record["rows"]] == data_prep.QUICK_SIZES
    assert all(r["prepare_mb_s"] > 0 and r["copy_mb_s"] > 0 for r in record["rows"])
    assert set(record["linear_fit"]) == {
        "intercept_seconds",
        "microseconds_per_sample",
        "r_squared",
    }


@pytest.mark.horovod
@pytest.mark.bench
def test_scaling_reports_job_throughput(results: Path) -> None:
    record = _read(results, "scaling")
    assert record["median_examples_per_second"]["1x1"] > 0
    assert record["runs"]["1x1"][0]["steps_per_epoch"] >= 1


@pytest.mark.horovod
@pytest.mark.bench
def test_allreduce_reports_every_size_and_the_gradients(results: Path) -> None:
    record = _read(results, "allreduce")
    assert [r["bytes"] for r in record["allreduce"]] == allreduce.QUICK_SIZES
    assert all(r["busbw_gb_s"] > 0 for r in record["allreduce"])
    assert record["memcpy_gb_s"] > 0
    assert record["gradients"]["bytes"] > 100_000  # the CNN's ~57k float32 weights


@pytest.mark.horovod
@pytest.mark.bench
def test_report_writes_summary_and_plot(results: Path) -> None:
    written = write_report(results)
    summary = (results / "summary.md").read_text()
    assert "| What | Measured | Target | Verdict |" in summary
    assert (results / "scaling.png").read_bytes()[:4] == b"\x89PNG"
    assert len(written) == 2


def test_stack_runs_each_stack_with_its_own_python_and_horovodrun(tmp_path: Path) -> None:
    python = str(tmp_path / "venv" / "bin" / "python")
    command = stack.stack_command(python, 2, ["--epochs", "1"])
    assert command[0] == str(tmp_path / "venv" / "bin" / "horovodrun")
    assert command[1:6] == ["-np", "2", "-H", "localhost:2", "--gloo"]
    assert command[6:] == [python, "-m", "components.train", "--epochs", "1"]


def test_stack_leaves_out_model_for_a_tree_from_before_the_choice(tmp_path: Path) -> None:
    from components.train.config import TrainConfig

    config = TrainConfig(data="/d", output="/o", workers=2, model="small")
    before, after = tmp_path / "before", tmp_path / "after"
    for tree, flags in ((before, '"--model-dir"'), (after, '"--model-dir" "--model"')):
        (tree / "components" / "train").mkdir(parents=True)
        (tree / "components" / "train" / "config.py").write_text(flags)
    assert stack.tree_argv(after, config)[-2:] == ["--model", "small"]
    assert "--model" not in stack.tree_argv(before, config)
    with pytest.raises(ValueError, match="predates --model"):
        stack.tree_argv(before, TrainConfig(data="/d", output="/o", workers=2))


def test_scaling_layouts_parse() -> None:
    assert scaling.parse_layout("2x1") == (2, 1, False)
    assert scaling.parse_layout("4") == (4, 1, False)
    assert scaling.parse_layout("2x1p") == (2, 1, True)
    with pytest.raises(ValueError):
        scaling.parse_layout("0x1")
    ratios = scaling.derived_ratios(
        {"1x1": 100.0, "2x1": 180.0, "1x2": 150.0, "1x1p": 80.0, "2x1p": 120.0}
    )
    assert ratios == {
        "efficiency": 0.9,
        "efficiency_pinned": 0.75,
        "ceiling_ratio": 1.2,
        "1x2_over_1x1": 1.5,
    }
    assert scaling.derived_ratios({"1x1": 100.0, "4x1": 300.0}) == {"efficiency_4x1": 0.75}
    assert scaling.secondary_model(None, None, quick=True) is None
    assert scaling.secondary_model("", "x", quick=False) is None
    assert scaling.secondary_model(None, "small", quick=False) is None


def test_levers_figures_compare_like_with_like() -> None:
    fp16, xla = levers.pick_levers("fp16,xla")
    medians = {"2x1": 100.0, "1x1": 80.0, "1x2": 125.0, "2x1+fp16": 110.0}
    medians |= {"2x1+xla": 90.0, "1x1+xla": 50.0, "1x2+xla": 90.0}
    assert levers.figures(medians, levers.BASELINE) == {
        "examples_per_second_2x1": 100.0, "over_baseline_2x1": 1.0, "ceiling_ratio": 0.8,
        "efficiency": 0.625, "references": "plain 1x1, 1x2",
    }  # fmt: skip
    plain_refs = levers.figures(medians, fp16)
    assert (plain_refs["ceiling_ratio"], plain_refs["efficiency"]) == (0.88, 0.688)
    own_refs = levers.figures(medians, xla)  # XLA changes a lone process too: its own 1x1, 1x2
    assert (own_refs["ceiling_ratio"], own_refs["efficiency"]) == (1.0, 0.9)
    assert (own_refs["over_baseline_1x1"], own_refs["references"]) == (0.625, "with the lever")
    with pytest.raises(ValueError, match="unknown levers"):
        levers.pick_levers("fp16,turbo")
    assert levers.lever_env(levers.pick_levers("cycle_time_1ms")[0], 2) == {
        "HOROVOD_CYCLE_TIME": "1"
    }


def test_levers_accuracy_reports_both_and_the_verdict() -> None:
    def rows(*acc: float) -> list[dict[str, Any]]:
        return [{"test_accuracy": a, "seed": 42 + i} for i, a in enumerate(acc)]

    table = levers.accuracy_table(
        {"baseline": rows(0.97, 0.98, 0.99), "fp16": rows(0.98, 0.98, 0.98),
         "xla": rows(0.96, 0.97, 0.97)},
        tolerance=0.002,
    )  # fmt: skip
    assert table["baseline"]["mean"] == 0.98 and "keeps_accuracy" not in table["baseline"]
    assert table["fp16"]["keeps_accuracy"] is True and table["fp16"]["difference_of_means"] == 0
    assert table["xla"]["keeps_accuracy"] is False and table["xla"]["test_accuracy"][0] == 0.96
    assert table["xla"]["seeds"] == [42, 43, 44]


def test_step_profile_counts_overlapping_tensors_once(tmp_path: Path) -> None:
    assert step_profile.union_length([(0, 4), (2, 6), (10, 12)], 1, 11) == 6
    start = 1_000_000.0  # the timeline's start, unix microseconds
    events = [
        {"name": "process_name", "ph": "M", "args": {"start_time_since_epoch_in_micros": start}}
    ]
    for pid in (1, 2):  # two tensors negotiated and reduced together, twice
        for t0 in (1000, 3000):
            events += [
                {"ph": "B", "name": "NEGOTIATE_ALLREDUCE", "ts": t0, "pid": pid},
                {"ph": "E", "ts": t0 + 400, "pid": pid},
                {"ph": "B", "name": "ALLREDUCE", "ts": t0 + 400, "pid": pid},
                {"ph": "E", "ts": t0 + 600, "pid": pid},
            ]
    path = tmp_path / "timeline.json"
    path.write_text(json.dumps(events)[:-1] + ",")  # as Horovod leaves it: no closing bracket
    window = {"start_unix": (start + 0) / 1e6, "end_unix": (start + 4000) / 1e6, "steps": 2}
    per_step = step_profile.timeline_per_step(path, window)
    assert (per_step["NEGOTIATE_ALLREDUCE"], per_step["ALLREDUCE"]) == (0.4, 0.2)
    assert step_profile.breakdown(2.0, per_step)["outside_horovod_ms"] == 1.4
    rank = {
        "window": {"seconds": 0.004, "steps": 2},
        "threads": [
            {"tid": 1, "origin": "main", "user_seconds": 0.002, "system_seconds": 0.0},
            {"tid": 2, "origin": "horovod", "user_seconds": 0.0, "system_seconds": 0.001},
        ],
    }
    table = step_profile.thread_table(rank)
    assert table["cpu_ms_per_step_by_origin"] == {"horovod": 0.5, "main": 1.0}
    assert (table["step_ms"], table["cores_busy"]) == (2.0, 0.75)


def test_pin_gives_each_rank_its_own_cores() -> None:
    from bench.pin import cores_for

    assert [cores_for(r, 1, [0, 1]) for r in range(2)] == [{0}, {1}]
    assert cores_for(0, 2, [0, 1]) == {0, 1}
    assert cores_for(2, 1, [0, 1]) == {0}  # more ranks than cores: wrap around


@pytest.mark.horovod
@pytest.mark.bench
def test_multi_job_benchmarks_run(tmp_path: Path, local_pipeline_run: LocalRun) -> None:
    """The benchmarks that need several real jobs. The pipeline's segments are those of the
    session's tiny `run-local` (which test_e2e_local checks), and the allreduce sizes were
    measured by the module's fixture: only the profiled timeline run is added here. Levers: the
    plain 2x1 job and one lever (2 jobs), and one profiled 2x1 run."""
    out, work = tmp_path / "results", tmp_path / "work"
    common = ["--quick", "--out", str(out), "--work", str(work)]
    assert mwms.main(common) == 0
    assert time_to_accuracy.main(common) == 0
    profile = allreduce.timeline_run(work, 600, 1, grad_allreduce_seconds=0.001)
    assert profile["timeline"]["step_ms"] > 0 and profile["step"]["step_seconds_2x1"] > 0
    segments = pipeline_overhead.segments(local_pipeline_run.job)
    configs = {"e2e": LOCAL_RUN_FLAGS}
    write_result(
        pipeline_overhead.NAME,
        pipeline_overhead.record(configs, 2, {"e2e": [segments]}, machine_state()),
        out,
    )
    assert levers.main([*common, "--levers", "fp16", "--no-references"]) == 0  # 2 jobs
    assert levers.main([*common, "--profile"]) == 0  # 1 job
    assert _read(out, "mwms")["ratios"]["horovod_over_mwms_throughput"] > 0
    tta = _read(out, "time_to_accuracy")
    assert set(tta["median_wall_seconds_to_target"]) == {"1x1", "1x2", "2x1"}
    assert set(tta["speedup_wall"]) == {"2x1_vs_1x1", "2x1_vs_1x2", "1x2_vs_1x1"}
    assert tta["sampling_runs"]["random_2019"][0]["coverage"]["disjoint"] is False
    assert tta["sampling_runs"]["disjoint_shards"][0]["coverage"]["disjoint"] is True
    pipe = _read(out, "pipeline_overhead")["medians"]["e2e"]
    assert set(pipe["task_seconds"]) >= {"prepare-data", "train", "evaluate", "register-model"}
    assert 0 < pipe["training_seconds"] < pipe["train_task_seconds"] < pipe["total_seconds"]
    assert 0 < pipe["not_training_share"] < 1
    lv = _read(out, "levers")
    assert set(lv["median_examples_per_second"]) == {"2x1", "2x1+fp16"}
    assert lv["levers"]["fp16"]["over_baseline_2x1"] > 0
    assert 0 <= lv["runs"]["2x1+fp16"][0]["test_accuracy"] <= 1
    step = _read(out, "levers_profile")["profile"]
    assert set(step["threads"]) == {"rank0", "rank1"}
    assert step["threads"]["rank0"]["cpu_ms_per_step_by_origin"]["main"] > 0
    assert step["timeline_ms_per_step"]["ALLREDUCE"] > 0
    write_report(out)
    summary = (out / "summary.md").read_text()
    assert "Time to" in summary and "| Target | Required | Measured | Verdict |" in summary
    assert "Levers on the 2×1 job" in summary and "Where a 2×1 step goes" in summary


def test_faults_count_half_written_files_and_models(tmp_path: Path) -> None:
    done = {
        "run/model/saved_model.pb", "run/model/variables/variables.index",
        "run/checkpoints/epoch-0002/ckpt.index", "run/checkpoints/epoch-0002/checkpoint.json",
        "data/manifest.json", "data/train/images-00000.npy", "run/run_summary.json",
    }  # fmt: skip
    partial = {
        "run/checkpoints/epoch-0003/ckpt.index",  # no checkpoint.json
        "run/.run_summary.json.x1.tmp",  # a local write's temporary name
        "models/mnist-cnn/_staging/1.abc/saved_model.pb",  # the registry's GCS staging
        "export/variables/variables.index",  # a model without saved_model.pb
        "data2/test/labels-00000.npy",  # a dataset without manifest.json
    }
    for rel in done | partial:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("x")
    assert sorted(faults.half_written(str(tmp_path))) == sorted(partial)
    assert faults.models_exported(str(tmp_path / "run")) == 1
    assert faults.models_exported(str(tmp_path)) == 2


def test_faults_progress_and_the_readme_table(tmp_path: Path) -> None:
    lines = [(10.0 + 2 * k, f"[rank 0/2] checkpoint after epoch {k} written to x") for k in (1, 2)]
    assert faults.progress_at(lines, 15.0) == 2.5  # half an epoch after the 2nd checkpoint
    assert faults.progress_at(lines, 30.0) == 3.0 and faults.progress_at(lines, 5.0) == 0.0
    row = faults.record("sigstop", 0, True, epochs_lost=0.5, time_to_recover_s=9.0,
                        models_exported=1, half_written=[], named_after_s=0.4)  # fmt: skip
    assert row["survived"] and row["details"] == {"named_after_s": 0.4}
    assert not faults.record("cancel", 0, True, epochs_lost=0, time_to_recover_s=1,
                             models_exported=2, half_written=[])["survived"]  # fmt: skip
    readme = tmp_path / "README.md"
    readme.write_text(f"intro\n{faults.README_BEGIN}\nold\n{faults.README_END}\nrest\n")
    faults.write_readme_table({"summary": faults.summarise([row])}, readme)
    text = readme.read_text()
    assert "old" not in text and text.startswith("intro\n") and text.endswith("rest\n")
    assert (
        "| rank hangs (SIGSTOP) | launcher names it" in text
        and "| 1/1 | 0.5 | 9 (9–9) | 1 | 0 |" in text
    )
    (tmp_path / "none.md").write_text("no markers")
    with pytest.raises(ValueError, match="markers"):
        faults.write_readme_table({"summary": {}}, tmp_path / "none.md")


@pytest.mark.horovod
@pytest.mark.bench
def test_faults_benchmark_runs_and_writes_its_table(tmp_path: Path) -> None:
    """The benchmark's machinery on one fault, the KFP retry (one real job, no base run): the
    record, the summary and the table. Each fault's behaviour has its own real test, which is
    why the suite does not run them all again here: a killed rank (static,
    components/train/tests/test_trainer_resume.py; elastic, test_trainer_elastic.py), a frozen
    rank (test_rankwatch.py), GCS errors (tests/test_gcs_faults.py), damaged checkpoints
    (test_trainer_resume.py), KFP retry and cancel (test_mpijob_lifecycle.py)."""
    out, work = tmp_path / "results", tmp_path / "work"
    assert (
        faults.main(["--quick", "--only", "kfp_retry", "--out", str(out), "--work", str(work)]) == 0
    )
    record = _read(out, "faults")
    assert sorted(record["summary"]) == ["kfp_retry"]
    assert record["settings"]["model"] == "small" and record["all_survived"] is True
    (row,) = record["records"]
    assert (row["survived"], row["models_exported"], row["half_written"]) == (True, 1, [])
    table = faults.fault_table(record)
    assert table[0].startswith("| Fault | Recovery | Survived |") and len(table) == 3
    assert table[2].startswith(f"| {faults.LABELS['kfp_retry'][0]} |")
