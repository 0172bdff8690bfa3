"""Does the MPIJob's launcher want Open MPI's yielding waits too? Measured in containers.

The MPIJob's ranks share their pods' CPU limits with Horovod's threads and Open MPI's progress,
unlike local ranks. This runs MPIJobs of 2 and 3 workers x 1 slot through the container
harness (`standins.mpijob_harness`: mpi-operator and the kubelet played in Docker, the real
trainer image, sshd, Open MPI and the GCS emulator), each with the launcher command as built
(``-mca mpi_yield_when_idle 1``) and without it, interleaved; worker pods of 1 CPU each, scaled
to this machine by the harness. Needs Docker and the images (`make images-local
gcs-emulator-image`).

    python -m bench.mpijob_yield [--repeats 2]
"""

from __future__ import annotations

import functools
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench.common import base_parser, interleave, job_throughput, median, ratio, write_result
from components.common import defaults
from components.train.launch import YIELD_WHEN_IDLE

NAME = "mpijob_yield"


def without_yield(manifest: dict[str, Any]) -> dict[str, Any]:
    """`manifest` with the launcher's ``-mca mpi_yield_when_idle 1`` taken out."""
    launcher = manifest["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]
    command = launcher["containers"][0]["command"]
    at = command.index(YIELD_WHEN_IDLE[1]) - 1
    del command[at : at + len(YIELD_WHEN_IDLE)]
    return manifest


def measure(setup: dict[str, Any], workers: int, yields: bool, r: int) -> dict[str, Any]:
    """One MPIJob of `workers` x 1 slot: the job's examples/s from its run summary."""
    import dataclasses

    from components.common import storage
    from components.train import summary
    from components.train.cluster.job import ClusterJobParams
    from components.train.cluster.mpijob import build_manifest
    from components.train.config import TrainConfig
    from components.train.step import TrainStep
    from standins.mpijob_harness import MPIJobRun

    bucket = setup["bucket"]()
    name = f"yield-{workers}x1-{'y' if yields else 'n'}-{r}"
    train = TrainConfig(data=setup["data"], output=f"gs://{bucket}/{name}", workers=workers,
                        epochs=setup["epochs"], threads_per_worker=1)  # fmt: skip
    step = TrainStep(trainer_image=setup["image"], cpu_per_worker="1", memory_per_worker="3Gi")
    p = ClusterJobParams(train=train, step=step, run_name=name)
    manifest = build_manifest(p, "kfp")
    with MPIJobRun(manifest if yields else without_yield(manifest), setup["docker"],
                   Path(tempfile.mkdtemp(prefix=name)), emulator=setup["gcs"]) as job:  # fmt: skip
        job.start_workers()
        result = job.run_launcher(timeout=900)
    if result.exit_code != 0:
        raise RuntimeError(f"{name} failed:\n{result.log[-3000:]}")
    record = summary.read(train.summary_uri)
    assert storage.exists(storage.join(train.model_uri, "saved_model.pb"))
    use = record.resource_use
    throughput = job_throughput(dataclasses.asdict(record))
    return {"examples_per_second": throughput, "seconds": result.seconds,
            "estimated_efficiency": use["estimated_efficiency"] if use else None}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    """CLI: ``python -m bench.mpijob_yield``."""
    import itertools
    import os

    import docker

    from components.common import storage
    from components.data_prep.prep import prepare
    from standins.fake_gcs import create_bucket, fake_gcs_container

    registry, tag = defaults.LOCAL_IMAGE_REGISTRY, defaults.LOCAL_IMAGE_TAG
    numbers = itertools.count()

    p = base_parser(__doc__ or NAME)
    p.add_argument("--train-samples", type=int, default=4000)
    p.add_argument("--epochs", type=int, default=3)
    a = p.parse_args(argv)
    if a.quick:
        a.train_samples, a.epochs, a.repeats = 600, 2, 1
    client = docker.from_env()
    with fake_gcs_container(client, f"{registry}/gcs-emulator:{tag}") as (gcs, url):
        os.environ.update(STORAGE_EMULATOR_HOST=url, GOOGLE_CLOUD_PROJECT="emulator")
        storage._client.cache_clear()  # the storage client of this process: the emulator's

        def new_bucket() -> str:
            name = f"{NAME.replace('_', '-')}-{os.getpid()}-{next(numbers)}"
            create_bucket(url, name)
            return name

        data = f"gs://{new_bucket()}/data"
        prepare("bundled", data, shard_size=1000, limit=a.train_samples)
        trainer = defaults.image_ref("trainer", registry, tag)
        setup = {"data": data, "epochs": a.epochs, "image": trainer,
                 "docker": client, "gcs": gcs, "bucket": new_bucket}  # fmt: skip
        variants = {
            f"{w}x1_{'yield' if y else 'busy_wait'}": functools.partial(measure, setup, w, y)
            for w in (2, 3) for y in (True, False)
        }  # fmt: skip
        runs = interleave(variants, a.repeats)
    medians = {k: median([r["examples_per_second"] for r in v]) for k, v in runs.items()}
    result = {
        "settings": {"workers": [2, 3], "slots_per_worker": 1, "cpu_per_worker": "1",
                     "train_samples": a.train_samples, "epochs": a.epochs,
                     "repeats": a.repeats, "model": defaults.MODEL},  # fmt: skip
        "runs": runs, "median_examples_per_second": medians,
        "yield_over_busy_wait": {
            f"{w}x1": ratio(medians[f"{w}x1_yield"], medians[f"{w}x1_busy_wait"]) for w in (2, 3)
        },
    }  # fmt: skip
    write_result(NAME, result, a.out)
    print(medians, result["yield_over_busy_wait"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
