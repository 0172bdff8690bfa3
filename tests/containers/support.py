"""Helpers of the container tests (fixtures are in conftest.py)."""

from __future__ import annotations

import itertools
import os
from typing import Any

import pytest

from components.common import defaults
from tests.conftest import create_bucket

_buckets = itertools.count()


def local_tag() -> str:
    """The tag of the images under test: `make test-containers LOCAL_TAG=<tag>` builds and tests
    images of that tag, so that checkouts of different code tested at once on one Docker engine
    do not test each other's images (the default, ``dev``, is shared)."""
    return os.environ.get("KFP_HOROVOD_TEST_IMAGE_TAG") or defaults.LOCAL_IMAGE_TAG


def require_images(client: Any, *components: str) -> dict[str, str]:
    """The references `make images-local` tags `components`' images (or support images) with;
    fail if one is not built."""
    import docker

    registry, tag = defaults.LOCAL_IMAGE_REGISTRY, local_tag()
    refs = {
        c: defaults.image_ref(c, registry, tag)
        if c in defaults.IMAGE_NAMES
        else f"{registry}/{c}:{tag}"
        for c in components
    }
    for ref in refs.values():
        try:
            client.images.get(ref)
        except docker.errors.ImageNotFound:
            pytest.fail(
                f"image {ref} is not built; run `make images-local gcs-emulator-image"
                + (f" LOCAL_TAG={tag}`" if tag != defaults.LOCAL_IMAGE_TAG else "`")
            )
    return refs


def new_bucket() -> str:
    """A new bucket in the emulator container (needs `gcs_host`)."""
    return create_bucket(f"containers-{os.getpid()}-{next(_buckets)}")
