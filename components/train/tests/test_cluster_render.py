"""``python -m pipeline render-mpijob`` / ``render-trainjob``: the dry run prints the exact, valid
manifests the train step would submit, as YAML; bad input is a usage error naming it."""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from components.common import defaults
from components.train.launcher.cluster.job import check_manifests, job_kind
from components.train.tests.cluster_jobs import make_params
from pipeline.cli import cli


def render(command: str, *args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, [f"render-{command}", *args])
    return result.exit_code, result.output


def launcher(manifests: list[dict[str, Any]]) -> dict[str, Any]:
    """The launcher container of an MPIJob, or a TrainJob's trainer (node 0's launcher)."""
    job = manifests[-1]
    if job["kind"] == "MPIJob":
        return dict(job["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0])
    return dict(job["spec"]["trainer"])


@pytest.mark.parametrize(
    ("command", "extra"),
    [("mpijob", ["--gpus-per-worker", "2", "--queue", "train"]), ("trainjob", [])],
)
def test_render_prints_the_exact_valid_manifests(command: str, extra: list[str]) -> None:
    code, out = render(
        command,
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
        "--trainer-service-account",
        "trainer",
        *extra,
    )
    assert code == 0, out
    manifests = list(yaml.safe_load_all(out))
    b = job_kind(command)
    check_manifests(b, manifests)
    gpus = {"gpus_per_worker": 2, "queue": "train"} if extra else {}
    p = make_params(
        "gs://b",
        data="gs://b/data",
        output="gs://b/out",
        workers=3,
        slots_per_worker=2,
        run_name="Nightly #7",
        pipeline_run_id="r-1",
        trainer_service_account="trainer",
        trainer_image=defaults.image_ref("trainer_gpu" if gpus else "trainer"),
        **gpus,
    )  # the GPU trainer image is what --gpus-per-worker > 0 picks
    assert manifests == b.build(p, "team-a")  # the name and command: test_cluster_manifest.py


def test_gpus_pick_the_gpu_trainer_image_and_a_given_image_wins() -> None:
    def images(*args: str) -> set[str]:
        code, out = render("mpijob", "--workers", "2", *args)
        assert code == 0, out
        spec = yaml.safe_load(out)["spec"]["mpiReplicaSpecs"]
        return {spec[r]["template"]["spec"]["containers"][0]["image"] for r in spec}

    assert images() == {defaults.image_ref("trainer")}
    assert images("--gpus-per-worker", "1") == {defaults.image_ref("trainer_gpu")}
    assert images("--gpus-per-worker", "1", "--image-tag", "v2") == {
        defaults.image_ref("trainer_gpu", tag="v2")
    }
    assert images("--gpus-per-worker", "1", "--trainer-image", "me/mine:1") == {"me/mine:1"}


@pytest.mark.parametrize("command", ["mpijob", "trainjob"])
def test_render_defaults_use_the_placeholder_bucket_and_the_image_options(command: str) -> None:
    code, out = render(
        command,
        "--workers",
        "2",
        "--image-registry",
        "europe-docker.pkg.dev/p/r",
        "--image-tag",
        "v9",
        "--model",
        "small",
        "--augment",
    )
    assert code == 0, out
    manifests = list(yaml.safe_load_all(out))
    check_manifests(job_kind(command), manifests)
    container = launcher(manifests)
    assert container["image"] == "europe-docker.pkg.dev/p/r/kfp-horovod-trainer:v9"
    command_line = container["command"]
    assert "gs://YOUR_BUCKET/kfp-horovod/runs/dry-run" in command_line
    assert command_line[command_line.index("--model") + 1] == "small"
    assert "--augment" in command_line
    assert all("namespace" not in m["metadata"] for m in manifests)


@pytest.mark.parametrize(
    ("command", "args", "messages"),
    [
        (
            "mpijob",
            ["--workers", "0", "--data", "/local/data", "--model", "resnet"],
            [
                "workers must be >= 1, got 0",
                "data must be a gs:// URI",
                "model must be one of the built-in models mnist_advanced, small",
            ],
        ),
        (
            "mpijob",
            ["--workers", "2", "--slots-per-worker", "2", "--gpus-per-worker", "1"],
            ["gpus_per_worker must be 0 (CPU) or >= slots_per_worker"],
        ),
        (
            "trainjob",
            ["--min-workers", "1"],
            ["elastic training needs mpi-operator's discover_hosts.sh"],
        ),
        ("trainjob", ["--data", "/tmp/data"], ["data must be a gs:// URI for a cluster backend"]),
        ("trainjob", ["--queue", "q"], ["No such option '--queue'"]),
        ("mpijob", ["--run-name", " "], ["invalid cluster job parameters: run_name is empty"]),
        *(
            (
                command,
                ["--node-selector", '{"bad key": "x"}'],
                ["node_selector: label key 'bad key'"],
            )
            for command in ("mpijob", "trainjob")
        ),
    ],
)
def test_bad_input_is_a_usage_error_naming_it(
    command: str, args: list[str], messages: list[str]
) -> None:
    code, out = render(command, *args)
    assert code == 2 and all(m in out for m in messages), out
