"""KFP definition of data prep: a thin wrapper over ``components.data_prep.prep``."""

from kfp import dsl
from kfp.dsl import Dataset, Output


def prepare_data(
    source: str,
    sha256: str,
    shard_size: int,
    limit: int,
    dataset: Output[Dataset],
) -> None:
    """Write the MNIST dataset from `source` under ``dataset.path``.

    `source` is ``bundled`` or a URL/gs:// path of an mnist.npz; `sha256` its expected hash
    (``none`` disables the check); `limit` keeps the first N samples per split (0: all).
    """
    from components.data_prep.prep import manifest_sha256, parse_sha256, prepare

    manifest = prepare(source, dataset.path, shard_size, parse_sha256(sha256), limit)
    for split, body in manifest["splits"].items():
        dataset.metadata[f"{split}_count"] = body["count"]
        dataset.metadata[f"{split}_shards"] = len(body["shards"])
    dataset.metadata["manifest_sha256"] = manifest_sha256(dataset.path)
    dataset.metadata["source"] = manifest["source"]["uri"]
    dataset.metadata["source_sha256"] = manifest["source"]["sha256"]
    dataset.metadata["format"] = manifest["format"]


def make_component(image: str) -> dsl.base_component.BaseComponent:
    """The KFP data prep component running in `image`."""
    return dsl.component(base_image=image, install_kfp_package=False)(prepare_data)
