"""Helpers of the container tests (fixtures are in conftest.py)."""

from __future__ import annotations

import itertools
import os
import re
import time
from collections import defaultdict
from typing import Any

import pytest

from components.common import defaults, storage
from components.train import checkpoints
from components.train.cluster.job import ClusterJobParams
from components.train.config import TrainConfig
from components.train.step import TrainStep

_buckets = itertools.count()
_TAGGED = re.compile(r"^\[1,(\d+)\]<(stdout|stderr)>:(.*)$")
NAMESPACE = "kfp"
STALL_SECONDS = 60  # the cluster jobs' default stall bound here


# The tag of the images under test: `make test-containers LOCAL_TAG=<tag>` builds and tests
# images of that tag, so that checkouts of different code tested at once on one Docker engine
# do not test each other's images (the default, ``dev``, is shared).
IMAGE_TAG_ENV = "KFP_HOROVOD_TEST_IMAGE_TAG"


def local_tag() -> str:
    """The tag of the local images these tests run (`IMAGE_TAG_ENV`, else ``dev``)."""
    return os.environ.get(IMAGE_TAG_ENV) or defaults.LOCAL_IMAGE_TAG


def local_image(component: str) -> str:
    """The reference `make images-local` tags a component image (or a support image) with."""
    registry, tag = defaults.LOCAL_IMAGE_REGISTRY, local_tag()
    if component in defaults.IMAGE_NAMES:
        return defaults.image_ref(component, registry, tag)
    return f"{registry}/{component}:{tag}"


def unavailable(why: str) -> None:
    """Skip; in CI (``CI`` set) fail instead, so a green CI run always ran these tests."""
    if os.environ.get("CI"):
        pytest.fail(f"{why} (CI must run the container tests: `make test-containers`)")
    pytest.skip(why)


def require_images(client: Any, *components: str) -> dict[str, str]:
    """The local references of `components`' images; skip (fail in CI) if one is not built."""
    import docker

    refs = {c: local_image(c) for c in components}
    for ref in refs.values():
        try:
            client.images.get(ref)
        except docker.errors.ImageNotFound:
            unavailable(
                f"image {ref} is not built; run `make images-local gcs-emulator-image"
                + (f" LOCAL_TAG={local_tag()}`" if local_tag() != defaults.LOCAL_IMAGE_TAG else "`")
            )
    return refs


def new_bucket() -> str:
    """A new bucket in the emulator container (needs `gcs_host`)."""
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage as gcs

    name = f"containers-{os.getpid()}-{next(_buckets)}"
    gcs.Client(project="emulator", credentials=AnonymousCredentials()).create_bucket(name)
    return name


# --- the cluster jobs' tests (MPIJob and TrainJob) ------------------------------------------


def params(
    image: str, data_uri: str, run: str, stall: int = STALL_SECONDS, **train: Any
) -> ClusterJobParams:
    """A run of 2 epochs, batch 32, of the small model, with a stall bound of `stall` seconds;
    `train` sets TrainConfig fields (workers, epochs, ...)."""
    config = TrainConfig(
        **{"data": data_uri, "output": f"gs://{new_bucket()}/{run}", "workers": 2, "epochs": 2,
           "batch_size_per_worker": 32, "model": "small", **train}
    )  # fmt: skip
    step = TrainStep(
        trainer_image=image, cpu_per_worker="1", memory_per_worker="2Gi",
        stall_shutdown_seconds=stall,
    )  # fmt: skip
    return ClusterJobParams(run_name=run, train=config, step=step)


def tagged_lines(log: str) -> list[tuple[int, str]]:
    """``(rank, text)`` of every line mpirun tagged with its rank (``--tag-output``)."""
    return [(int(m[1]), m[3]) for m in map(_TAGGED.match, log.splitlines()) if m]


def assert_epochs_once_and_no_line_per_rank(log: str, epochs: int) -> None:
    """Each ``Epoch k/N `` line is printed once, by rank 0, and no line once per rank."""
    lines = tagged_lines(log)
    assert lines, "no rank-tagged output: was --tag-output dropped?"
    for epoch in range(1, epochs + 1):
        hits = [(r, t) for r, t in lines if f"Epoch {epoch}/{epochs} " in t]
        assert len(hits) == 1 and hits[0][0] == 0, hits
    ranks_by_text: dict[str, set[int]] = defaultdict(set)
    for rank, text in lines:
        ranks_by_text[text].add(rank)
    repeated = {t: sorted(r) for t, r in ranks_by_text.items() if len(r) > 1 and t.strip()}
    assert not repeated, f"lines printed once per rank: {repeated}"


def model_files(bucket_prefix: str) -> list[str]:
    return [u for u in storage.list_files(bucket_prefix) if u.endswith("/saved_model.pb")]


def bucket_of(uri: str) -> str:
    return "/".join(uri.split("/")[:3])


def wait_for_checkpoint(uri: str, job: Any, timeout: float = 300) -> int:
    """The epoch of the first checkpoint under `uri`, while `job`'s launcher runs."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        info = checkpoints.latest(uri)
        if info is not None:
            return info.epoch
        job.launcher.reload()
        assert job.launcher.status == "running", job.launcher.logs().decode()[-3000:]
        time.sleep(0.5)
    raise TimeoutError(f"no checkpoint under {uri} after {timeout:g} s")
