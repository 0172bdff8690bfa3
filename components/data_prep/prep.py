"""Data prep program: read a source, validate it, write sharded splits plus a manifest."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from components.common import dataset, storage
from components.common.defaults import MNIST_SHA256, SHARD_SIZE
from components.data_prep.sources import load_source


def prepare(
    source: str,
    output: str,
    shard_size: int = SHARD_SIZE,
    expected_sha256: str | None = MNIST_SHA256,
    limit: int | None = None,
) -> dict[str, Any]:
    """Write the dataset from `source` to `output` and return its manifest.

    `limit` keeps only the first `limit` training and test samples (for quick runs). The
    output is deterministic: the same source and arguments give byte-identical files.
    Nothing is written unless the whole source validates; ``manifest.json`` is written last.
    """
    if shard_size < 1:
        raise ValueError(f"--shard-size must be >= 1, got {shard_size}")
    if limit is not None and limit < 1:
        raise ValueError(f"--limit must be >= 1, got {limit}")
    if storage.exists(storage.join(output, dataset.MANIFEST)):
        raise FileExistsError(f"{output}: already holds a dataset (manifest.json); refusing to overwrite")
    data = load_source(source, expected_sha256)
    splits = {}
    for name, (x, y) in data.splits.items():
        x, y = dataset.validate_arrays(x, y, f"{data.description.get('uri', source)} [{name}]")
        if limit is not None:
            x, y = x[:limit], y[:limit]
        splits[name] = (x, y)
    description = dict(data.description)
    if limit is not None:
        description["limit"] = limit
    return dataset.write_dataset(output, splits, description, shard_size)


def main(argv: list[str] | None = None) -> int:
    """CLI: ``python -m components.data_prep.prep --source bundled --output DIR``."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--source", default="bundled", help="'bundled' or URL/gs:///path of mnist.npz")
    parser.add_argument("--output", required=True, help="dataset directory (local or gs://)")
    parser.add_argument("--shard-size", type=int, default=SHARD_SIZE)
    parser.add_argument(
        "--sha256", default=MNIST_SHA256, help="expected sha256 of the source file, or 'none'"
    )
    parser.add_argument("--limit", type=int, default=None, help="keep only the first N samples per split")
    args = parser.parse_args(argv)
    expected = None if args.sha256.lower() == "none" else args.sha256
    try:
        manifest = prepare(args.source, args.output, args.shard_size, expected, args.limit)
    except (dataset.DataError, ValueError, FileExistsError) as exc:
        print(f"data prep failed: {exc}", file=sys.stderr)
        return 2
    counts = {k: v["count"] for k, v in manifest["splits"].items()}
    print(f"dataset written to {args.output}: {json.dumps(counts)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
