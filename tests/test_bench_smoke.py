"""Smoke test of the benchmarks: each runs at tiny sizes and writes valid JSON. No timings.

The arithmetic (layouts, the levers' figures, time to accuracy's targets, plateau and verdict)
runs in ``make test``. Everything that starts real Horovod jobs is marked ``horovod`` and
``bench``, and runs in ``make test-bench`` (which ``.ci/run`` runs): the module's `results`
(data prep, scaling's 1x1 and 2x1 with the machine's ceiling, the report) and the benchmarks
that need several jobs (MWMS, time to accuracy, the whole pipeline, two levers jobs, two stacks).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from bench import (
    data_prep,
    faults,
    levers,
    mwms,
    pipeline_overhead,
    scaling,
    stack,
    time_to_accuracy,
)
from bench.common import machine_state, write_result
from bench.report import write_report
from standins.outputs import half_written, models_exported
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
    assert scaling.main([*common, "--layouts", "1x1,2x1"]) == 0
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
    # The machine's own ceiling: two 1x1 jobs at once, each its own run summary's throughput.
    copies = record["runs"][scaling.COPIES][0]
    assert len(copies["per_copy"]) == 2 and all(rate > 0 for rate in copies["per_copy"])
    assert copies["examples_per_second"] == pytest.approx(sum(copies["per_copy"]))
    ceiling = record["machine_ceiling"]
    assert ceiling["efficiency_vs_machine"] == pytest.approx(
        record["median_examples_per_second"]["2x1"] / copies["examples_per_second"], abs=1e-3
    )
    assert set(record["settings"]["layouts"]) == {"1x1", "2x1"}


@pytest.mark.horovod
@pytest.mark.bench
def test_report_writes_summary_and_plot(results: Path) -> None:
    written = write_report(results)
    summary = (results / "summary.md").read_text()
    assert "| Target | Required | Measured | Verdict |" in summary
    assert (results / "scaling.png").read_bytes()[:4] == b"\x89PNG"
    assert len(written) == 2


def test_scaling_layouts_parse() -> None:
    assert scaling.parse_layout("2x1") == (2, 1)
    assert scaling.parse_layout("4") == (4, 1)
    with pytest.raises(ValueError):
        scaling.parse_layout("0x1")
    ratios = scaling.derived_ratios({"1x1": 100.0, "2x1": 180.0, "1x2": 150.0})
    assert ratios == {"efficiency": 0.9, "ceiling_ratio": 1.2, "1x2_over_1x1": 1.5}
    assert scaling.derived_ratios({"1x1": 100.0, "4x1": 300.0}) == {"efficiency_4x1": 0.75}
    assert scaling.secondary_model(None, None, quick=True) is None
    assert scaling.secondary_model("", "x", quick=False) is None
    assert scaling.secondary_model(None, "small", quick=False) is None


def test_levers_compare_each_with_the_default_of_its_rank_count() -> None:
    gloo, three, gloo_three = levers.pick_levers("gloo,3x1,gloo_3x1")
    medians = {"1x1": 80.0, "1x2": 125.0, "baseline": 150.0, "gloo": 120.0, "3x1": 180.0,
               "gloo_3x1": 120.0}  # fmt: skip
    runs = {"gloo": [{"estimated_efficiency": 0.8}, {"estimated_efficiency": 0.7}]}
    base = levers.figures(medians, levers.BASELINE, {})
    assert (base["over_baseline"], base["efficiency"], base["ceiling_ratio"]) == (1.0, 0.938, 1.2)
    row = levers.figures(medians, gloo, runs)
    assert (row["over_baseline"], row["efficiency"], row["ceiling_ratio"]) == (0.8, 0.75, 0.96)
    assert row["estimated_efficiency"] == pytest.approx(0.75)
    row3 = levers.figures(medians, gloo_three, {})
    assert (row3["over_baseline"], row3["efficiency"]) == (0.667, 0.5)  # against 3x1
    assert "ceiling_ratio" not in row3 and three.workers == 3
    with pytest.raises(ValueError, match="unknown levers"):
        levers.pick_levers("gloo,turbo")


def _curve(*points: tuple[float, float]) -> list[dict[str, float]]:
    """(training seconds, accuracy) points, an epoch apart, wall = training + 10 s."""
    return [
        {"epoch": i + 1, "training_seconds": s, "wall_seconds": s + 10, "accuracy": a}
        for i, (s, a) in enumerate(points)
    ]


def test_time_to_accuracy_targets_plateau_speedups_and_the_rule() -> None:
    tta = time_to_accuracy
    one = [{"seed": s, "curve": _curve((30, 0.95), (60, 0.96), (90, 0.972)),
            "final_accuracy": 0.972} for s in (1, 2, 3)]  # fmt: skip
    two = [{"seed": s, "curve": _curve((20, 0.955), (40, 0.965), (60, 0.97)),
            "final_accuracy": 0.97} for s in (1, 2, 3)]  # fmt: skip
    sqrt = [{"seed": s, "curve": _curve((20, 0.962), (40, 0.97)), "final_accuracy": 0.969}
            for s in (1, 2, 3)]  # fmt: skip
    hit = tta.reached(one, 0.96)
    assert (hit["reached"], hit["median_training_seconds"], hit["median_wall_seconds"]) == (
        3, 60.0, 70.0,
    )  # fmt: skip
    assert tta.reached(one, 0.99) == {"reached": 0, "of": 3, "training_seconds": [None] * 3,
                                      "wall_seconds": [None] * 3, "epochs": [None] * 3}  # fmt: skip
    plateau = tta.plateau(one, 1000)
    assert plateau["standard_error"] == 0.0052
    assert plateau["targets_at_plateau"] == [0.97]  # 0.97 >= 0.972 - 2 x 0.0052
    runs = {"1x1": one, "1x2": one, "2x1": two, "2x1_sqrt": sqrt}
    times = {n: {t: tta.reached(rs, t) for t in tta.TARGETS} for n, rs in runs.items()}
    sp = tta.speedups(times, plateau["targets_at_plateau"])
    assert sp["0.96"]["2x1_vs_1x1_training"] == 1.5 and sp["0.97"]["at_plateau"] is True
    verdict = tta.rules(times, runs, tolerance=0.002)
    assert verdict["rules"]["sqrt"] == {
        "median_training_seconds_to_96": 20.0,
        "final_accuracy_mean": 0.969,
        "keeps_accuracy": True,
    }
    assert verdict["adopt"] == "sqrt"
    strict = tta.rules(times, runs, tolerance=0.0005)
    assert strict["rules"]["sqrt"]["keeps_accuracy"] is False and strict["adopt"] == "linear"


@pytest.mark.horovod
@pytest.mark.bench
def test_multi_job_benchmarks_run(tmp_path: Path, local_pipeline_run: LocalRun) -> None:
    """The benchmarks that need several real jobs. The pipeline's segments are those of the
    session's tiny `run-local` (which test_e2e_local checks). Levers: the default 2x1 job and
    one lever (2 jobs, plus the 1x1 and 1x2 references)."""
    out, work = tmp_path / "results", tmp_path / "work"
    common = ["--quick", "--out", str(out), "--work", str(work)]
    assert mwms.main(common) == 0
    assert time_to_accuracy.main([*common, "--variants", "1x1,1x2,2x1,2x1_adadelta"]) == 0
    segments = pipeline_overhead.segments(local_pipeline_run.job)
    configs = {"e2e": LOCAL_RUN_FLAGS}
    write_result(
        pipeline_overhead.NAME,
        pipeline_overhead.record(configs, 2, {"e2e": [segments]}, machine_state()),
        out,
    )
    assert levers.main([*common, "--levers", "gloo"]) == 0
    assert _read(out, "mwms")["ratios"]["horovod_over_mwms_throughput"] > 0
    tta = _read(out, "time_to_accuracy")
    assert set(tta["runs"]) == {"1x1", "1x2", "2x1", "2x1_adadelta"}
    curve = tta["runs"]["2x1"][0]["curve"]
    assert [round(p["epoch"] % 1, 1) for p in curve] == [0.4, 0.0, 0.4, 0.0]  # 2 per epoch
    assert all(0 <= p["accuracy"] <= 1 and p["wall_seconds"] > p["training_seconds"] > 0
               for p in curve)  # fmt: skip
    assert set(tta["rules"]) == {"linear", "adadelta"} and "plateau" in tta
    pipe = _read(out, "pipeline_overhead")["medians"]["e2e"]
    assert set(pipe["task_seconds"]) >= {"prepare-data", "train", "evaluate", "register-model"}
    assert 0 < pipe["training_seconds"] < pipe["train_task_seconds"] < pipe["total_seconds"]
    assert 0 < pipe["not_training_share"] < 1
    lv = _read(out, "levers")
    assert set(lv["median_examples_per_second"]) == {"1x1", "1x2", "two_copies", "baseline", "gloo"}
    # The machine's ceiling is the sum of the two copies' own throughputs, and the ratio is
    # computed from the medians (no bound on its value: a quick run's one timed epoch of a few
    # steps is noise, and the guide times nothing in tests).
    (copies,) = lv["runs"]["two_copies"]
    assert copies["examples_per_second"] == pytest.approx(sum(copies["per_copy"]))
    medians = lv["median_examples_per_second"]
    expected = round(medians["two_copies"] / (2 * medians["1x1"]), 3)
    assert lv["two_copies_over_two_1x1"] == expected > 0
    assert lv["runs"]["gloo"][0]["controller"] == "gloo"
    assert lv["runs"]["baseline"][0]["controller"] == "mpi"
    assert 0 < lv["levers"]["baseline"]["estimated_efficiency"] <= 1
    write_report(out)
    summary = (out / "summary.md").read_text()
    assert "Time to" in summary and "| Target | Required | Measured | Verdict |" in summary
    assert (out / "time_to_accuracy.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.horovod
@pytest.mark.bench
def test_stack_benchmark_runs_two_environments(tmp_path: Path) -> None:
    """Two stacks side by side, here this environment twice: every layout of both, interleaved,
    each stack's versions read from its own interpreter."""
    out = tmp_path / "results"
    flags = ["--quick", "--out", str(out), "--work", str(tmp_path / "work")]
    assert stack.main([*flags, "--other-python", sys.executable, "--other-name", "again"]) == 0
    record = _read(out, "stack")
    assert set(record["stacks"]) == {"this", "again"}
    assert record["stacks"]["this"] == record["stacks"]["again"]
    assert record["stacks"]["this"]["horovod"] == "0.28.1"
    assert set(record["runs"]) == {f"{s}/{lay}" for s in ("this", "again") for lay in stack.LAYOUTS}
    assert all(v > 0 for v in record["this_over_other"].values())
    assert 0 < record["figures"]["this"]["efficiency_vs_machine"] < 2


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
    assert sorted(half_written(str(tmp_path))) == sorted(partial)
    assert models_exported(str(tmp_path / "run")) == 1
    assert models_exported(str(tmp_path)) == 2


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
