"""`python -m pipeline render-mpijob`: the dry run prints the exact, valid manifest as YAML."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml
from click.testing import CliRunner

from components.common import defaults
from components.train.cluster.params import ClusterJobParams, job_name
from components.train.config import TrainConfig
from components.train.mpijob.manifest import build_manifest
from components.train.mpijob.validate import validate_manifest
from pipeline.cli import cli

ROOT = Path(__file__).resolve().parents[3]


def render(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, ["render-mpijob", *args])
    return result.exit_code, result.output


def test_render_prints_the_exact_valid_manifest() -> None:
    code, out = render(
        "--workers",
        "3",
        "--slots-per-worker",
        "2",
        "--run-name",
        "Nightly #7",
        "--pipeline-run-id",
        "r-1",
        "--namespace",
        "team-a",
        "--data",
        "gs://b/data",
        "--output",
        "gs://b/out",
        "--gpus-per-worker",
        "2",
        "--queue",
        "train",
    )
    assert code == 0, out
    manifest = yaml.safe_load(out)
    validate_manifest(manifest)
    expected = build_manifest(
        ClusterJobParams(
            run_name="Nightly #7",
            pipeline_run_id="r-1",
            train=TrainConfig(
                data="gs://b/data",
                output="gs://b/out",
                workers=3,
                slots_per_worker=2,
                gpus_per_worker=2,
            ),
            image=defaults.image_ref("trainer_gpu"),  # what --gpus-per-worker > 0 picks
            queue="train",
        ),
        "team-a",
    )
    assert manifest == expected
    assert manifest["metadata"]["name"] == job_name("Nightly #7", "r-1")
    cmd = manifest["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0][
        "command"
    ]
    assert cmd[cmd.index("--workers") + 1] == "3"
    assert cmd[cmd.index("--slots-per-worker") + 1] == "2"  # 6 ranks


def test_gpus_pick_the_gpu_trainer_image_and_a_given_image_wins() -> None:
    def images(*args: str) -> set[str]:
        code, out = render("--workers", "2", *args)
        assert code == 0, out
        spec = yaml.safe_load(out)["spec"]["mpiReplicaSpecs"]
        return {spec[r]["template"]["spec"]["containers"][0]["image"] for r in spec}

    assert images() == {defaults.image_ref("trainer")}
    assert images("--gpus-per-worker", "1") == {defaults.image_ref("trainer_gpu")}
    assert images("--gpus-per-worker", "1", "--image-tag", "v2") == {
        defaults.image_ref("trainer_gpu", tag="v2")
    }
    assert images("--gpus-per-worker", "1", "--image", "me/mine:1") == {"me/mine:1"}


def test_a_gpu_count_a_worker_cannot_share_among_its_ranks_is_refused() -> None:
    code, out = render("--workers", "2", "--slots-per-worker", "2", "--gpus-per-worker", "1")
    assert code == 2
    assert "gpus_per_worker must be 0 (CPU) or >= slots_per_worker" in out


def test_render_defaults_use_placeholder_bucket_and_image_options() -> None:
    code, out = render(
        "--workers", "2", "--image-registry", "europe-docker.pkg.dev/p/r", "--image-tag", "v9"
    )
    assert code == 0, out
    m = yaml.safe_load(out)
    validate_manifest(m)
    launcher = m["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0]
    assert launcher["image"] == "europe-docker.pkg.dev/p/r/kfp-horovod-trainer:v9"
    assert "gs://YOUR_BUCKET/kfp-horovod/runs/dry-run" in launcher["command"]
    assert "namespace" not in m["metadata"]


def test_render_bad_input_is_a_usage_error_naming_the_parameter() -> None:
    code, out = render("--workers", "0", "--data", "/local/data", "--model", "resnet")
    assert code == 2
    assert "workers must be >= 1, got 0" in out
    assert "data must be a gs:// URI" in out
    assert "model must be one of the built-in models mnist_advanced, small" in out


def test_render_passes_model_and_augment_to_the_trainer() -> None:
    code, out = render("--model", "small", "--augment")
    assert code == 0, out
    launcher = yaml.safe_load(out)["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"][
        "containers"
    ][0]
    command = launcher["command"]
    assert command[command.index("--model") + 1] == "small" and "--augment" in command


def test_module_entry_point_prints_yaml() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "pipeline", "render-mpijob", "--workers", "4", "--run-name", "x"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    m = yaml.safe_load(proc.stdout)
    validate_manifest(m)
    assert m["spec"]["mpiReplicaSpecs"]["Worker"]["replicas"] == 4
