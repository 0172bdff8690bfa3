"""Data prep program: read a source, validate it, write sharded splits plus a manifest."""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from components.common import dataset, storage, storage_access
from components.common.dataset import read_manifest
from components.common.declare import add_arguments
from components.common.defaults import BUNDLED_SOURCE, MNIST_SHA256, SHARD_SIZE
from components.common.failure import InputError, one_line_failures
from components.data_prep.sources import load_bundled, load_mnist_npz
from components.data_prep.step_parameters import PREP_PARAMETERS, PrepStep


def parse_sha256(value: str) -> str | None:
    """``none`` (any case) disables the check."""
    return None if value.strip().lower() == "none" else value.strip()


def check_output_free(output: str) -> None:
    """Refuse an output that already holds anything (an empty local directory is fine)."""
    if not output:
        raise InputError("output location is empty")
    if storage.is_gcs(output):
        if storage.list_files(output):
            raise InputError(f"{output}: not empty; refusing to overwrite")
        return
    path = Path(output)
    if path.exists() and (not path.is_dir() or any(path.iterdir())):
        raise InputError(f"{output}: already exists and is not empty; refusing to overwrite")
    storage_access.check_local_folder("output", output)  # before the work, not at its end


def prepare(
    source: str,
    output: str,
    shard_size: int = SHARD_SIZE,
    expected_sha256: str | None = MNIST_SHA256,
    limit: int | None = None,
) -> dict[str, Any]:
    """Write the dataset from `source` to `output` and return its manifest.

    `limit` keeps only the first `limit` samples of each split (None or 0: all). The same
    source and arguments give byte-identical files, and nothing is written unless the whole
    source validates. The dataset is staged locally, then published: locally by one rename, on
    GCS with ``manifest.json`` last (readers key on it).
    """
    # Every parameter rule, in one line naming each bad value (the check step's words).
    PrepStep(source, expected_sha256 or "none", limit or 0, shard_size)
    limit = limit or None
    check_output_free(output)
    bundled = source in ("bundled", BUNDLED_SOURCE)  # identified by its arrays' sha256
    data = load_bundled() if bundled else load_mnist_npz(source, expected_sha256)
    splits = {}
    for name, (x, y) in data.splits.items():  # the whole source validates, not just the limit
        x, y = dataset.validate_arrays(x, y, f"{data.description['uri']} [{name}]")
        splits[name] = (x[:limit], y[:limit])
    if limit is not None:
        data.description["limit"] = limit
    with tempfile.TemporaryDirectory(prefix="data-prep-") as staging:
        manifest = dataset.write_dataset(staging, splits, data.description, shard_size)
        if not storage.is_gcs(output) and os.path.isdir(output):
            os.rmdir(output)  # an empty directory made by the caller (e.g. KFP); checked above
        storage.upload_dir(staging, output, last=dataset.MANIFEST)
    return manifest


def prepare_step(
    data_source: str, data_sha256: str, data_limit: int, shard_size: int, dataset: Any
) -> None:
    """The data-prep step: `prepare` into the Dataset artifact `dataset`, with its metadata."""
    manifest = prepare(data_source, dataset.path, shard_size, parse_sha256(data_sha256), data_limit)
    for split, body in manifest["splits"].items():
        dataset.metadata[f"{split}_count"] = body["count"]
        dataset.metadata[f"{split}_shards"] = len(body["shards"])
    dataset.metadata["manifest_sha256"] = read_manifest(dataset.path).sha256
    dataset.metadata["source"] = manifest["source"]["uri"]
    dataset.metadata["source_sha256"] = manifest["source"]["sha256"]
    dataset.metadata["format"] = manifest["format"]


def main(argv: list[str] | None = None) -> int:
    """CLI: ``python -m components.data_prep.prep --data-source bundled --output DIR``; bad
    input ends it as it ends the step (`one_line_failures`)."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--output", required=True, help="dataset directory (local or gs://)")
    add_arguments(parser, PREP_PARAMETERS)
    args = parser.parse_args(argv)
    sha256 = parse_sha256(args.data_sha256)
    with one_line_failures():
        manifest = prepare(args.data_source, args.output, args.shard_size, sha256, args.data_limit)
    counts = {k: v["count"] for k, v in manifest["splits"].items()}
    print(f"dataset written to {args.output}: {json.dumps(counts)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
