"""Helpers of the container tests (fixtures are in conftest.py)."""

from __future__ import annotations

import itertools
import os
from typing import Any

import pytest

from components.common import defaults

_buckets = itertools.count()


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


def require_images(client: Any, *components: str) -> dict[str, str]:
    """The local references of `components`' images; fail if one is not built."""
    import docker

    refs = {c: local_image(c) for c in components}
    for ref in refs.values():
        try:
            client.images.get(ref)
        except docker.errors.ImageNotFound:
            pytest.fail(
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
