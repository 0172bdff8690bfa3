"""The publish step's work: every slice's part report joined and checked, every shard found, then
the manifest written (the dataset exists from that moment). Runs in the data prep publish task's
pod, or in `prepare`'s process.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from components.common import dataset, storage
from components.common.dataset import DataError, ImageSpec
from components.data_prep.convert import Target

# The bad images a refusal names (all are counted).
NAMED_BAD = 3


def image_spec(parts: list[dict[str, Any]], target: Target) -> ImageSpec:
    """The dataset's image: the target's size or the one size every image has, the target's
    channels or, for ``auto``, 3 if any image is in colour."""
    sizes: Counter[str] = Counter()
    examples: dict[str, str] = {}
    for part in parts:
        sizes.update(part["sizes"])
        for size, name in part["size_examples"].items():
            examples.setdefault(size, name)
    if not sizes:
        raise DataError("no image could be read: the dataset would be empty")
    if len(sizes) > 1:
        (a, _), (b, _) = sizes.most_common(2)
        raise DataError(
            f"images have different sizes: {examples[a]} is {a}, {examples[b]} is {b}; "
            "set image_size to resize every image to one size"
        )
    height, width = (int(n) for n in next(iter(sizes)).split("x"))
    seen = {int(c) for part in parts for c in part["channels"]}
    channels = target.channels or (3 if 3 in seen else 1)
    return ImageSpec(height, width, channels)


def check_bad_images(parts: list[dict[str, Any]], skip: bool) -> dict[str, Any]:
    """The skipped images' record for the manifest; DataError naming the first few, with their
    count, unless `skip`."""
    count = sum(int(p["bad_count"]) for p in parts)
    named = [b for p in parts for b in p["bad"]]
    if count and not skip:
        listed = ", ".join(f"{b['name']} ({b['reason']})" for b in named[:NAMED_BAD])
        more = f" and {count - NAMED_BAD} more" if count > NAMED_BAD else ""
        raise DataError(
            f"{count} image(s) cannot be used: {listed}{more}; fix or remove them, or set "
            "skip_bad_images to leave them out"
        )
    return {"count": count, "examples": named[:NAMED_BAD]}


def class_names(listed: list[str] | None, counts: dict[str, Counter[int]]) -> list[str]:
    """The listing's classes, or a TFRecord source's: "0" to the highest label."""
    if listed is not None:
        return listed
    highest = max((label for c in counts.values() for label in c), default=-1)
    return [str(k) for k in range(highest + 1)]


def check_splits(source: str, classes: list[str], counts: dict[str, Counter[int]]) -> None:
    """Two classes or more, each with training images (after any skipped), and a test split."""
    if len(classes) < 2:
        raise DataError(f"{source}: {len(classes)} class(es); a classifier needs two or more")
    trained = counts.get("train", Counter())
    missing = [name for k, name in enumerate(classes) if not trained.get(k)]
    if missing:
        labels = " (its labels must count from 0 without gaps)" if classes[0] == "0" else ""
        raise DataError(
            f"{source}: class {missing[0]!r} has no training images{labels}"
            + (f" (nor have {len(missing) - 1} more classes)" if len(missing) > 1 else "")
        )
    if not sum(counts.get("test", Counter()).values()):
        raise DataError(
            f"{source}: the test split is empty: raise test_fraction, or give the index test rows"
        )


def check_shards(shards: list[dict[str, Any]]) -> None:
    """Every shard is there with the bytes its slice wrote (GCS: the listing's CRC32C, nothing
    downloaded; locally: sha256), or DataError naming it."""
    by_folder: dict[str, list[dict[str, Any]]] = {}
    for shard in shards:
        by_folder.setdefault(shard["uri"].rpartition("/")[0], []).append(shard)
    for folder, written in by_folder.items():
        found = storage.checksums(folder)
        for shard in written:
            name = shard["uri"].rpartition("/")[2]
            expected = shard["crc32c"] if storage.is_gcs(folder) else shard["sha256"]
            if name not in found:
                raise DataError(f"{shard['uri']}: missing (written by its slice, gone since)")
            if found[name] != expected:
                raise DataError(f"{shard['uri']}: not the bytes its slice wrote")


def publish(
    listing: dict[str, Any],
    parts: list[dict[str, Any]],
    output: str,
    target: Target,
    skip_bad_images: bool,
) -> dict[str, Any]:
    """Check the parts (in slice order) and write the manifest at `output`; return it."""
    skipped = check_bad_images(parts, skip_bad_images)
    image = image_spec(parts, target)
    counts: dict[str, Counter[int]] = {}
    for part in parts:
        for split, by_label in part["class_counts"].items():
            counts.setdefault(split, Counter()).update({int(k): n for k, n in by_label.items()})
    classes = class_names(listing["classes"], counts)
    source = listing["source"]
    check_splits(source["uri"], classes, counts)
    splits: dict[str, Any] = {}
    for split in sorted(counts, key=lambda s: (s not in dataset.SPLITS, s)):
        shards = [s for part in parts for s in part["shards"].get(split, [])]
        check_shards(shards)
        splits[split] = {
            "count": sum(s["count"] for s in shards),
            "class_counts": {name: counts[split].get(k, 0) for k, name in enumerate(classes)},
            "shards": [
                {
                    "location": dataset.relative_to(output, s["uri"]),
                    "count": s["count"],
                    "sha256": s["sha256"],
                }
                for s in shards
            ],
        }
    manifest = {
        "format": dataset.FORMAT,
        "image": {"height": image.height, "width": image.width, "channels": image.channels},
        "classes": classes,
        "source": source,
        "skipped": skipped,
        "splits": splits,
    }
    dataset.write_manifest(output, manifest)
    return manifest
