"""What a run left under its output, checkpoint, dataset and registry locations (local or
gs://), as the tests and the fault benchmark check it: the models exported, and the files left
half-written. Not a stand-in for anything; shared here so that neither imports the other."""

from __future__ import annotations

import re

from components.common import storage


def models_exported(root: str) -> int:
    """``saved_model.pb`` files under `root` (local or gs://)."""
    return sum(f.endswith("/saved_model.pb") for f in storage.list_files(root))


def _owner(rel: str) -> tuple[str, str] | None:
    """The directory a file belongs to and the file that makes it complete, if any."""
    parts = rel.split("/")
    if checkpoint := re.fullmatch(r"(ckpt-\d+)\.data-\d+-of-\d+", parts[-1]):
        return "/".join(parts[:-1]), f"{checkpoint[1]}.index"
    for i, part in enumerate(parts[:-1]):
        if part == "variables":
            return "/".join(parts[:i]), "saved_model.pb"
        if part in ("train", "test") and parts[-1].endswith(".npy"):
            return "/".join(parts[:i]), "manifest.json"
    return None


def half_written(root: str) -> list[str]:
    """Files under `root` left partial: temporary or staging names (a dot-name, ``_staging``),
    and files whose completing file is missing: a checkpoint's data file without its index
    (``ckpt-3.data-00000-of-00001`` without ``ckpt-3.index``), a model without
    ``saved_model.pb``, a dataset without ``manifest.json``."""
    rels = storage.relative_files(root)
    present = set(rels)
    bad = []
    for rel in rels:
        parts, owner = rel.split("/"), _owner(rel)
        staged = any(p.startswith(".") for p in parts) or "_staging" in parts
        incomplete = owner is not None and "/".join(filter(None, owner)) not in present
        if staged or incomplete:
            bad.append(rel)
    return bad
