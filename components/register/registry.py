"""One model's directory in the registry: version numbers claimed by exclusive create, run records
that make a re-run idempotent, aliases moved by compare-and-swap, publishing that never shows a
partial version. Runs in the register step's pod, ``make serve`` and the pipeline's CLI. Layout
and guarantees: components/register/README.md.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import shutil
import tempfile
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from components.common import storage
from components.common.failure import ExpectedError, InputError
from components.common.model_files import SAVED_MODEL_PB

CLAIMS = "_claims"
RUNS = "_runs"
ALIASES = "_aliases"
STAGING = "_staging"
METADATA_FILE = "kfp_horovod_metadata.json"
REGISTRY_FORMAT = "kfp-horovod/model-registry/v1"
NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
MAX_CLAIM_ATTEMPTS = 1000
MAX_ALIAS_ATTEMPTS = 100


class RegistryError(ExpectedError):
    """The registry could not be updated; the message names the location."""


def check_name(kind: str, value: str) -> str:
    """`value` if it is a safe path segment, else ValueError."""
    if not NAME_PATTERN.match(value) or value in (".", ".."):
        raise InputError(
            f"{kind} {value!r} is not allowed: use 1-128 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit"
        )
    return value


def json_bytes(record: Mapping[str, Any]) -> bytes:
    """A registry record as written: indented JSON with sorted keys, one final newline."""
    return (json.dumps(record, indent=2, sort_keys=True) + "\n").encode("utf-8")


def _parse_json(data: bytes, where: str) -> dict[str, Any]:
    try:
        record = json.loads(data)
    except ValueError as exc:
        raise RegistryError(f"{where}: not valid JSON ({exc})") from exc
    if not isinstance(record, dict):
        raise RegistryError(f"{where}: expected a JSON object")
    return record


def read_record(uri: str) -> tuple[dict[str, Any] | None, str]:
    """The JSON record at `uri` (None if absent) and its compare-and-swap token."""
    data, token = storage.read_versioned(uri)
    return (None if data is None else _parse_json(data, uri)), token


def challenger_wins(candidate: dict[str, Any], champion: dict[str, Any] | None) -> tuple[bool, str]:
    """Champion/challenger rule: higher accuracy wins; equal accuracy, lower loss wins."""
    if champion is None:
        return True, "no production version yet"
    new, old = candidate["metrics"], champion.get("metrics", {})
    old_acc, old_loss = float(old.get("accuracy", -1.0)), float(old.get("loss", math.inf))
    version = champion.get("version")
    if new["accuracy"] > old_acc:
        return True, f"accuracy {new['accuracy']:.4f} > {old_acc:.4f} of version {version}"
    if new["accuracy"] == old_acc and new["loss"] < old_loss:
        return True, (
            f"accuracy ties version {version} at {old_acc:.4f} and loss "
            f"{new['loss']:.4f} < {old_loss:.4f}"
        )
    return False, f"accuracy {new['accuracy']:.4f} does not beat {old_acc:.4f} of version {version}"


# Version numbers are claimed with ``O_EXCL`` locally and ``ifGenerationMatch=0`` on GCS; a reader
# keyed on ``saved_model.pb`` never sees a partial version.
@dataclass(frozen=True)
class ModelStore:
    """One model's directory in the registry."""

    root: str
    model_name: str

    def __post_init__(self) -> None:
        if not self.root:
            raise InputError("registry root is empty")
        if storage.is_gcs(self.root):
            storage.split_gcs(self.root)  # raises for a URI without a bucket
        check_name("model name", self.model_name)

    @property
    def base(self) -> str:
        return storage.join(self.root, self.model_name)

    def version_uri(self, version: int) -> str:
        return storage.join(self.base, str(version))

    def _claim_uri(self, version: int) -> str:
        return storage.join(self.base, CLAIMS, f"{version}.json")

    def _run_uri(self, run_id: str) -> str:
        key = hashlib.sha256(run_id.encode("utf-8")).hexdigest()[:32]
        return storage.join(self.base, RUNS, f"{key}.json")

    def alias_uri(self, alias: str) -> str:
        return storage.join(self.base, ALIASES, f"{check_name('alias', alias)}.json")

    def claimed_versions(self) -> list[int]:
        """Every version number claimed so far (published or not), sorted."""
        claims = storage.list_files(storage.join(self.base, CLAIMS))
        stems = (uri.rsplit("/", 1)[-1].removesuffix(".json") for uri in claims)
        return sorted(int(stem) for stem in stems if stem.isdigit())

    def claim_next_version(self, record: dict[str, Any]) -> int:
        """Take the next free version number by exclusive creation of its claim file."""
        version = max(self.claimed_versions(), default=0) + 1
        for _ in range(MAX_CLAIM_ATTEMPTS):
            if storage.create_exclusive(self._claim_uri(version), json_bytes(record)):
                return version
            version += 1  # someone else got it first; the next one is free or soon known
        raise RegistryError(f"{self.base}: could not claim a version in {MAX_CLAIM_ATTEMPTS} tries")

    def claim_for_run(self, run_id: str, previous: dict[str, Any] | None, started: str) -> int:
        """The version `run_id` publishes: the one an earlier attempt of the same run claimed
        (`previous`, its run record) and did not finish, or the next free number, bound to the
        run so that a re-run finds it."""
        if previous is not None:
            return int(previous["version"])
        version = self.claim_next_version({"pipeline_run_id": run_id, "claimed_at": started})
        record = {"pipeline_run_id": run_id, "version": version}
        if storage.create_exclusive(self._run_uri(run_id), json_bytes(record)):
            return version
        bound = self.find_run(run_id)  # the same run registering concurrently got there first
        return int(bound["version"]) if bound else version

    def find_run(self, run_id: str) -> dict[str, Any] | None:
        return read_record(self._run_uri(run_id))[0]

    def update_run(self, run_id: str, record: dict[str, Any]) -> None:
        storage.write_bytes(self._run_uri(run_id), json_bytes(record))

    def is_published(self, version: int) -> bool:
        """True once the version's SavedModel is complete (its ``saved_model.pb`` exists)."""
        return storage.exists(storage.join(self.version_uri(version), SAVED_MODEL_PB))

    def publish(self, version: int, model_dir: Path, metadata: dict[str, Any]) -> str:
        """Copy the SavedModel at `model_dir` plus `metadata` to the version's directory
        (staged under ``_staging/`` on GCS, which cannot rename). A complete version is left
        alone; a partial one (an attempt that died while copying) is overwritten."""
        dest = self.version_uri(version)
        if self.is_published(version):
            return dest
        staging = storage.join(self.base, STAGING, f"{version}.{uuid.uuid4().hex}")  # GCS only
        with tempfile.TemporaryDirectory(prefix="register-") as tmp:
            staged = Path(tmp) / "version"
            shutil.copytree(model_dir, staged)
            (staged / METADATA_FILE).write_bytes(json_bytes(metadata))
            try:
                storage.upload_dir(staged, dest, last=SAVED_MODEL_PB, staging=staging)
            except OSError:
                if not self.is_published(version):  # lost a race to an identical publisher: fine
                    raise
        return dest

    def read_metadata(self, version: int) -> dict[str, Any]:
        uri = storage.join(self.version_uri(version), METADATA_FILE)
        return _parse_json(storage.read_bytes(uri), uri)

    def published_versions(self) -> list[int]:
        """Numeric version directories holding a complete SavedModel, sorted."""
        return [v for v in self.claimed_versions() if self.is_published(v)]

    def read_alias(self, alias: str) -> tuple[dict[str, Any] | None, str]:
        """The alias record (None if unset) and its compare-and-swap token."""
        return read_record(self.alias_uri(alias))

    def move_alias_if(
        self,
        alias: str,
        candidate: dict[str, Any],
        wins: Callable[[dict[str, Any], dict[str, Any] | None], tuple[bool, str]],
    ) -> tuple[bool, str, dict[str, Any] | None]:
        """Point `alias` at `candidate` (a record with ``version``) if `wins(candidate,
        current)`; decided again whenever the alias changed under us, so concurrent
        registrations end with the best one promoted. Returns (promoted, reason, the record
        compared against)."""
        for _ in range(MAX_ALIAS_ATTEMPTS):
            current, token = self.read_alias(alias)
            if current is not None and current.get("version") == candidate["version"]:
                return True, f"version {candidate['version']} already holds {alias!r}", None
            won, reason = wins(candidate, current)
            if not won:
                return False, reason, current
            record = dict(candidate)
            if current is not None:
                record["previous"] = {
                    k: current.get(k) for k in ("version", "metrics", "pipeline_run_id")
                }
            if storage.write_if_unchanged(self.alias_uri(alias), json_bytes(record), token):
                return True, reason, current
        raise RegistryError(f"{self.alias_uri(alias)}: kept changing; gave up after retries")
