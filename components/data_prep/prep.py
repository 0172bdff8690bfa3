"""The data prep program: a source (`components.data_prep.sources`) into the prepared dataset
(`components.common.dataset`), in three steps, each run in its own KFP task's pod
(`list_data_step`, `prepare_slice_step`, `publish_dataset_step`), or all three in one process
(`prepare`: the CLI, the tests, the benchmarks).
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

import click
import numpy as np

from components.common import dataset, storage, storage_access
from components.common.declare import declared_options, run_command
from components.common.failure import InputError, one_line_failures
from components.data_prep.convert import Target, convert_slice
from components.data_prep.publish import publish
from components.data_prep.sources import Item, Listing, list_source
from components.data_prep.step_parameters import PrepStep

LISTING = "listing.json"
IMAGES, LABELS = "images.npy", "labels.npy"
PART = "part.json"


def parse_sha256(value: str) -> str | None:
    """``none`` (any case) disables the check."""
    return None if value.strip().lower() == "none" else value.strip()


def slice_ranges(items: list[Item], parallelism: int) -> list[tuple[int, int]]:
    """At most `parallelism` consecutive, non-empty ranges of `items`, of nearly equal weight."""
    total = sum(i.weight for i in items)
    count = max(1, min(parallelism, len(items)))
    ranges: list[tuple[int, int]] = []
    start = running = 0
    for k, item in enumerate(items):
        running += item.weight
        if len(ranges) < count - 1 and running * count >= total * (len(ranges) + 1):
            ranges.append((start, k + 1))
            start = k + 1
    ranges.append((start, len(items)))
    return [r for r in ranges if r[0] < r[1]] or [(0, 0)]


def write_listing(listing: Listing, parallelism: int, folder: str) -> list[int]:
    """The listing artifact in `folder` (a local folder): its header, one item file per slice,
    an array source's arrays; return the slices' numbers."""
    ranges = slice_ranges(listing.items, parallelism)
    path = Path(folder)
    path.mkdir(parents=True, exist_ok=True)
    for k, (start, stop) in enumerate(ranges):
        lines = (json.dumps(item.to_json(), sort_keys=True) for item in listing.items[start:stop])
        (path / f"items-{k:05d}.jsonl").write_text("".join(f"{line}\n" for line in lines))
    if listing.arrays is not None:
        np.save(path / IMAGES, listing.arrays[0], allow_pickle=False)
        np.save(path / LABELS, listing.arrays[1], allow_pickle=False)
    header = {
        "kind": listing.kind,
        "source": listing.source,
        "classes": listing.classes,
        "counts": listing.counts,
        "slices": len(ranges),
        "arrays": listing.arrays is not None,
    }
    (path / LISTING).write_text(json.dumps(header, indent=2, sort_keys=True) + "\n")
    return list(range(len(ranges)))


def read_listing(folder: str) -> dict[str, Any]:
    header: dict[str, Any] = json.loads(Path(folder, LISTING).read_text())
    return header


def read_slice(folder: str, index: int) -> tuple[list[Item], Any]:
    """Slice `index`'s items and, for an array source, the arrays (memory-mapped)."""
    lines = Path(folder, f"items-{index:05d}.jsonl").read_text().splitlines()
    items = [Item.from_json(json.loads(line)) for line in lines if line]
    arrays = None
    if read_listing(folder)["arrays"]:
        arrays = (
            np.load(Path(folder, IMAGES), mmap_mode="r", allow_pickle=False),
            np.load(Path(folder, LABELS), mmap_mode="r", allow_pickle=False),
        )
    return items, arrays


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


# The three steps, on their KFP artifacts -----------------------------------------------------
#
# 1. `list_data_step`: the source's classes and images, split and ordered, cut into slices (at most
#    ``prep_parallelism``), written as the listing artifact; its output is the slices' numbers.
# 2. `prepare_slice_step`, one task per slice (``dsl.ParallelFor``): the slice's images converted
#    into TFRecord shards in the task's own ``shards`` artifact, and a part report.
# 3. `publish_dataset_step`: every part checked, every shard found, the manifest written.
#
# Nothing is a dataset until its manifest is written, last; an output that holds anything is
# refused.


def list_data_step(
    data_source: str,
    data_format: str,
    data_sha256: str,
    data_limit: int,
    test_fraction: float,
    prep_parallelism: int,
    listing: Any,
) -> list[int]:
    """Step 1: list the source into the `listing` artifact; the slices' numbers, for the
    ParallelFor over `prepare_slice_step`."""
    found = list_source(
        data_source, data_format, parse_sha256(data_sha256), data_limit, test_fraction
    )
    slices = write_listing(found, prep_parallelism, listing.path)
    listing.metadata.update({"source": found.source["uri"], "kind": found.kind, **found.counts})
    listing.metadata["slices"] = len(slices)
    return slices


def prepare_slice_step(
    listing: Any,
    slice_index: int,
    image_size: int,
    color_mode: str,
    skip_bad_images: bool,
    image_feature: str,
    label_feature: str,
    shard_size: int,
    shards: Any,
    part: Any,
) -> None:
    """Step 2: convert slice `slice_index` into the `shards` artifact; its report to `part`,
    which names each shard by the `shards` artifact's URI (where later steps read it)."""
    header = read_listing(listing.path)
    items, arrays = read_slice(listing.path, int(slice_index))  # kfp.local: a float
    os.makedirs(shards.path, exist_ok=True)
    report = convert_slice(
        items,
        int(slice_index),
        shards.path,
        Target(image_size, color_mode),
        arrays,
        shard_size,
        image_feature,
        label_feature,
        header["source"].get("test_fraction", 0.2),
    )
    for written in report["shards"].values():  # where the next steps find them
        for shard in written:
            shard["uri"] = storage.join(shards.uri, shard["uri"].rpartition("/")[2])
    Path(part.path).write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")
    shards.metadata["records"] = sum(s["count"] for w in report["shards"].values() for s in w)


def publish_dataset_step(
    listing: Any,
    parts: list[Any],
    image_size: int,
    color_mode: str,
    skip_bad_images: bool,
    dataset: Any,
) -> None:
    """Step 3: check the slices' parts and write the manifest into the `dataset` artifact."""
    reports = [json.loads(Path(p.path).read_text()) for p in parts]
    reports.sort(key=lambda r: int(r["slice"]))  # ParallelFor collects them in any order
    header = read_listing(listing.path)
    manifest = publish(
        header, reports, dataset.uri, Target(image_size, color_mode), skip_bad_images
    )
    written = read_manifest_metadata(dataset.uri)
    dataset.metadata.update(written | {"source": manifest["source"]["uri"]})


def read_manifest_metadata(uri: str) -> dict[str, Any]:
    """What the Dataset artifact's metadata shows of the manifest at `uri`."""
    manifest = dataset.read_manifest(uri)
    found: dict[str, Any] = {
        "format": dataset.FORMAT,
        "image": manifest.image.describe(),
        "classes": len(manifest.classes),
        "manifest_sha256": manifest.sha256,
    }
    for split, shards in manifest.splits.items():
        found[f"{split}_count"] = sum(s.count for s in shards)
        found[f"{split}_shards"] = len(shards)
    return found


# All three in one process -----------------------------------------------------------------


def prepare(data_source: str, output: str, **parameters: Any) -> dict[str, Any]:
    """Write the dataset of `data_source` at `output` (the listing, every slice, the manifest,
    as the pipeline's steps do) and return its manifest. `parameters` are the other `PrepStep`
    parameters, by name. The same source and parameters give byte-identical files."""
    step = PrepStep(data_source=data_source, **parameters)
    expected_sha256 = parse_sha256(step.data_sha256)
    check_output_free(output)
    found = list_source(
        data_source, step.data_format, expected_sha256, step.data_limit, step.test_fraction
    )
    target = Target(step.image_size, step.color_mode)
    local = not storage.is_gcs(output)
    # Locally the dataset is staged beside `output` and renamed into place; on GCS the shards
    # are written first and the manifest last. Either way a failure leaves nothing behind.
    staging = _staging_beside(output) if local else output
    shards_uri = storage.join(staging, "shards")
    try:
        if local:
            os.makedirs(shards_uri)
        reports = [
            convert_slice(
                found.items[start:stop],
                k,
                shards_uri,
                target,
                found.arrays,
                step.shard_size,
                step.image_feature,
                step.label_feature,
                step.test_fraction,
            )
            for k, (start, stop) in enumerate(slice_ranges(found.items, step.prep_parallelism))
        ]
        header = {"classes": found.classes, "source": found.source}
        manifest = publish(header, reports, staging, target, step.skip_bad_images)
    except BaseException:
        storage.remove_tree(staging if local else shards_uri)
        raise
    if local:
        if os.path.isdir(output):
            os.rmdir(output)  # empty: checked above
        os.replace(staging, output)
    return manifest


def _staging_beside(output: str) -> str:
    path = Path(output).absolute()
    path.parent.mkdir(parents=True, exist_ok=True)
    return tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent)


@click.command(help="Prepare a dataset: list, convert and publish it in this process.")
@click.option("--output", required=True, help="dataset folder (local or gs://)")
@declared_options(PrepStep.parameters())
def command(output: str, data_source: str, **options: Any) -> int:
    """``python -m components.data_prep.prep --output DIR [--data-source ...]``; bad input
    ends it as it ends the step (`one_line_failures`)."""
    with one_line_failures():
        manifest = prepare(data_source, output, **options)
    counts = {k: v["count"] for k, v in manifest["splits"].items()}
    image = manifest["image"]
    shape = f"{image['height']}x{image['width']}x{image['channels']}"
    classes = len(manifest["classes"])
    print(f"dataset written to {output}: {json.dumps(counts)}; {classes} classes, {shape}")
    return 0


def main(argv: list[str] | None = None) -> int:
    return int(run_command(command, argv, "python -m components.data_prep.prep"))


if __name__ == "__main__":
    raise SystemExit(main())
