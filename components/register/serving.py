"""The serving folder of an alias, ``<root>/<model>/_serving/<alias>/<N>/``: exactly the version
the alias names. Synced in the register step's pod after every registration, by ``python -m
pipeline sync-serving`` and by ``make serve``.
"""

from __future__ import annotations

import random
import shutil
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from components.common import storage
from components.common.defaults import PRODUCTION_ALIAS
from components.register.registry import (
    SAVED_MODEL_PB,
    ModelStore,
    RegistryError,
    check_name,
    json_bytes,
    read_record,
)

SERVING = "_serving"
LEASE_SECONDS = 120.0


# A server pointed at the serving folder serves the champion, not the newest version (TF Serving
# serves the highest number it finds, and every version that passes the gate gets one).
# `ServingFolder.sync` makes it match the alias, after every registration's compare-and-swap and as
# ``python -m pipeline sync-serving``. What a server sees meanwhile, and why GCS cannot do better:
# components/register/README.md.
class ServingFolder:
    """The serving folder of `alias` in `store` (`lease_s` and `clock` for tests)."""

    def __init__(
        self,
        store: ModelStore,
        alias: str = PRODUCTION_ALIAS,
        lease_s: float | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store, self.alias = store, check_name("alias", alias)
        self.lease_s = LEASE_SECONDS if lease_s is None else lease_s
        self.clock = clock

    @property
    def uri(self) -> str:
        """Where TF Serving / KServe is pointed."""
        return storage.join(self.store.base, SERVING, self.alias)

    @property
    def lease_uri(self) -> str:
        """The lease that one sync at a time holds (beside the folder, not in it)."""
        return storage.join(self.store.base, SERVING, f"{self.alias}.lease.json")

    def version_uri(self, version: int) -> str:
        return storage.join(self.uri, str(version))

    def versions(self) -> list[int]:
        """The numeric folders present (complete or not), sorted: what TF Serving would list."""
        if storage.is_gcs(self.uri):
            names = {rel.split("/", 1)[0] for rel in storage.relative_files(self.uri)}
        else:
            folder = Path(self.uri)
            names = {p.name for p in folder.iterdir()} if folder.is_dir() else set()
        return sorted(int(name) for name in names if name.isdigit())

    def holds(self, version: int) -> bool:
        """True if ``<folder>/<version>`` has every file of the registered version, unchanged."""
        want = storage.checksums(self.store.version_uri(version))
        have = storage.checksums(self.version_uri(version))
        return bool(want) and all(have.get(rel) == digest for rel, digest in want.items())

    def matches(self, version: int) -> bool:
        return self.versions() == [version] and self.holds(version)

    def alias_version(self) -> int | None:
        """The version the alias names now (None: the alias is not set)."""
        record, _ = self.store.read_alias(self.alias)
        return None if record is None else int(record["version"])

    def sync(self) -> int | None:
        """Make the folder hold exactly the alias's version and return it; None (nothing
        touched) if the alias is not set. Only reads when the folder already matches; else, under
        the folder's lease, copies the version in, checks it, and only then removes the others."""
        version = self.alias_version()
        if version is None or self.matches(version):
            return version
        with self._lease():
            version = self.alias_version()  # the alias as it is now, inside the lease
            if version is None:
                return None
            if not self.holds(version):
                self._publish(version)
            for other in self.versions():
                if other != version:
                    self._remove(other)
            self._clean_leftovers()
        return version

    def _publish(self, version: int) -> None:
        """Copy the registered `version` in, then check every file against the version's own."""
        source, dest = self.store.version_uri(version), self.version_uri(version)
        if not self.store.is_published(version):
            raise RegistryError(
                f"{self.alias!r} names version {version}, but {source} holds no complete "
                "SavedModel: nothing to serve"
            )
        if storage.is_gcs(dest):
            want, have = storage.checksums(source), storage.checksums(dest)
            for rel in sorted(want, key=lambda r: r == SAVED_MODEL_PB):
                if have.get(rel) != want[rel]:
                    storage.copy_file(storage.join(source, rel), storage.join(dest, rel))
        else:
            self._remove(version)  # a local copy that does not hold the version: changed by hand
            storage.upload_dir(source, dest)  # staged under a dot-name, renamed into place
        if not self.holds(version):
            raise RegistryError(f"{dest}: does not hold version {version} after copying it")

    def _remove(self, version: int) -> None:
        """Remove ``<folder>/<version>``: ``saved_model.pb`` first on GCS; locally renamed away
        first (it disappears at once)."""
        uri = self.version_uri(version)
        if storage.is_gcs(uri):
            storage.remove_tree(uri, first=SAVED_MODEL_PB)
            return
        path = Path(uri)
        if path.exists():
            doomed = path.with_name(f".{version}.removed.{uuid.uuid4().hex}")
            path.rename(doomed)
            shutil.rmtree(doomed, ignore_errors=True)

    def _clean_leftovers(self) -> None:
        """Locally, the dot-folders a sync that died left behind (staged copies, removals)."""
        folder = Path(self.uri)
        if not storage.is_gcs(self.uri) and folder.is_dir():
            for path in folder.iterdir():
                if path.name.startswith(".") and path.is_dir():
                    shutil.rmtree(path, ignore_errors=True)

    @contextmanager
    def _lease(self) -> Iterator[None]:
        """Hold the folder's lease while the body runs, waiting while another sync holds it (at
        most until that lease expires, then taking it over)."""
        holder = uuid.uuid4().hex
        deadline = self.clock() + self.lease_s + 30.0
        while not self._take(holder):
            if self.clock() > deadline:
                raise RegistryError(f"{self.lease_uri}: still held after {self.lease_s:.0f} s")
            time.sleep(0.05 + random.random() * 0.2)
        try:
            yield
        finally:
            lease, token = read_record(self.lease_uri)
            if lease is not None and lease.get("holder") == holder:
                released = {"holder": None, "expires": 0}
                storage.write_if_unchanged(self.lease_uri, json_bytes(released), token)

    def _take(self, holder: str) -> bool:
        lease, token = read_record(self.lease_uri)
        if lease is not None and float(lease.get("expires", 0)) > self.clock():
            return False
        record = {"holder": holder, "expires": self.clock() + self.lease_s}
        return storage.write_if_unchanged(self.lease_uri, json_bytes(record), token)
