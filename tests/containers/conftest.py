"""Fixtures of the container tests: the Docker engine, the locally built images, and a GCS
emulator container that the jobs' networks reach as ``gcs`` and the tests reach on 127.0.0.1.

Where Docker or an image is missing these tests fail, naming the command that provides it:
`make test-containers` installs Docker, builds the images and runs them.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.conftest import storage_emulator
from tests.containers.support import new_bucket, require_images


@pytest.fixture(scope="session")
def docker_client() -> Iterator[Any]:
    """A client of the local Docker engine."""
    import docker

    try:
        client = docker.from_env()
        client.ping()
    except Exception as exc:  # docker.errors.DockerException, requests' ConnectionError
        pytest.fail(f"no Docker engine answers ({exc}); `make docker-ready` starts one")
    yield client
    client.close()


@pytest.fixture(scope="session")
def gcs_container(docker_client: Any) -> Iterator[tuple[Any, str]]:
    """The GCS emulator in a container: yields ``(container, "http://127.0.0.1:PORT")``."""
    from standins.fake_gcs import fake_gcs_container

    image = require_images(docker_client, "gcs-emulator")["gcs-emulator"]
    with fake_gcs_container(docker_client, image) as found:
        yield found


@pytest.fixture(scope="module")
def gcs_host(gcs_container: tuple[Any, str]) -> Iterator[str]:
    """Point this process's storage client at the emulator container (module-wide)."""
    with storage_emulator(gcs_container[1]):
        yield gcs_container[1]


@pytest.fixture(scope="module")
def trainer_image(docker_client: Any) -> str:
    """The trainer image under test."""
    return require_images(docker_client, "trainer")["trainer"]


# A user's Keras 3 model module (keras.ops, a custom layer, the functional API), installed into
# an image built FROM the trainer image, as a user ships their model (components/train/README.md).
USER_MODEL_MODULE = "keras3_user_model"


@pytest.fixture(scope="module")
def user_model_image(trainer_image: str, docker_client: Any) -> str:
    """The trainer image plus `USER_MODEL_MODULE` (components/train/tests/user_model.py) in its
    site-packages: ``--model keras3_user_model:build`` imports it on every pod."""
    import io
    import tarfile
    from pathlib import Path

    from components.common import defaults

    source = Path(__file__).resolve().parents[2] / "components/train/tests/user_model.py"
    dockerfile = (
        f"FROM {trainer_image}\nUSER root\nCOPY {USER_MODEL_MODULE}.py /tmp/\n"
        'RUN python -c "import shutil, sysconfig; shutil.move('
        f"'/tmp/{USER_MODEL_MODULE}.py', sysconfig.get_paths()['purelib'])\"\n"
        f"USER {defaults.MPI_USER_UID}\n"
    )
    context = io.BytesIO()
    with tarfile.open(fileobj=context, mode="w") as tar:
        for name, data in (("Dockerfile", dockerfile.encode()),
                           (f"{USER_MODEL_MODULE}.py", source.read_bytes())):  # fmt: skip
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    context.seek(0)
    tag = f"{trainer_image.rsplit(':', 1)[0]}-user-model:{trainer_image.rsplit(':', 1)[1]}"
    docker_client.images.build(fileobj=context, custom_context=True, tag=tag, rm=True)
    return tag


@pytest.fixture(scope="module")
def data_uri(gcs_host: str) -> str:
    """The bundled digits (1,200 train / 300 test) prepared onto the emulator from here."""
    from components.data_prep.prep import prepare

    uri = f"gs://{new_bucket()}/data"
    prepare("bundled", uri, shard_size=400, data_limit=1200)
    return uri
