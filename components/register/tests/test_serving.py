"""The serving folder follows the alias through promotions, registrations that do not promote and
crashes, and no single object write on gs:// shows a partial version; on local disk and on gs://
(fake-gcs-server). Concurrent promotions are raced in test_registry.py."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from components.common import storage
from components.common.failure import ExitCode
from components.register.registry import METADATA_FILE, SAVED_MODEL_PB, STAGING, ModelStore
from components.register.serving import ServingFolder
from components.register.tests.registering import register_run


def _folder(root: str) -> ServingFolder:
    return ServingFolder(ModelStore(root, "mnist-cnn"))


def test_no_object_write_on_gcs_shows_a_partial_version(
    trained_model, trained_summary, gcs_uri: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store is inspected after every single object upload, copy and delete of a first
    registration and of a promotion. Publishing: a reader keyed on saved_model.pb never sees a
    partial version, and the numeric directory (what TF Serving lists) is partial only during
    the server-side copies from the whole staged copy, never during the upload. The serving
    folder: a version is there whole at every step, the new one's saved_model.pb appears only
    once the rest of it has, and the old one loses a file only once the new one is whole."""
    from google.cloud.storage.blob import Blob

    root = f"{gcs_uri}/registry"
    folder = _folder(root)
    store = folder.store
    src = Path(trained_model.path)
    expected = {p.relative_to(src).as_posix() for p in src.rglob("*") if p.is_file()}
    expected.add(METADATA_FILE)
    publishing: list[str] = []
    serving: list[tuple[int, ...]] | None = None

    def inspect() -> None:
        for version in store.published_versions():
            assert set(storage.checksums(store.version_uri(version))) == expected, version
        visible = set(storage.checksums(store.version_uri(1)))
        staged = storage.checksums(storage.join(store.base, STAGING))
        if visible in (set(), expected):
            publishing.append("complete" if visible else "absent")
        else:
            assert any(rel.endswith(f"/{SAVED_MODEL_PB}") for rel in staged), visible
            assert SAVED_MODEL_PB not in visible
            publishing.append("copying")
        if serving is None:
            return  # the first version: the folder has nothing to keep whole yet
        files = storage.checksums(folder.uri)
        whole = tuple(v for v in (1, 2) if folder.holds(v))
        assert whole, files  # never without a whole version: the old one goes only after
        if f"2/{SAVED_MODEL_PB}" in files:
            assert 2 in whole, files  # a reader keyed on saved_model.pb never sees it partial
        serving.append(whole)

    for method in ("upload_from_filename", "rewrite", "delete"):
        real = getattr(Blob, method)

        def spy(self, *args, _real=real, **kwargs):
            out = _real(self, *args, **kwargs)
            inspect()
            return out

        monkeypatch.setattr(Blob, method, spy)
    assert register_run(trained_model, trained_summary, root, "run-1", 0.95).version == 1
    n = len(expected)
    assert publishing[: 2 * n] == ["absent"] * n + ["copying"] * (n - 1) + ["complete"]
    assert set(publishing[2 * n :]) == {"complete"}  # deleting the staged copy, the sync
    serving = []
    assert register_run(trained_model, trained_summary, root, "run-2", 0.97).promoted
    assert serving[0] == (1,) and (1, 2) in serving and serving[-1] == (2,)
    assert folder.versions() == [2] and not storage.checksums(storage.join(store.base, STAGING))


def _snapshot(root: str) -> dict[str, Any]:
    """Every object below ``_serving`` (the lease too) with its generation (GCS) or its inode
    and modification time (local): equal snapshots mean nothing was written."""
    base = storage.join(root, "mnist-cnn", "_serving")
    if storage.is_gcs(base):
        bucket, key = storage.split_gcs(base)
        client = storage._client()
        return {b.name: b.generation for b in client.list_blobs(bucket, prefix=key)}
    return {str(p): (p.stat().st_ino, p.stat().st_mtime_ns) for p in Path(base).rglob("*")}


def test_the_folder_follows_the_alias(trained_model, trained_summary, storage_root) -> None:
    """Promoted: the folder holds the new version alone. Not promoted: not one write there."""
    root, folder = storage_root, _folder(storage_root)
    assert register_run(trained_model, trained_summary, root, "run-a", 0.93).promoted
    assert folder.versions() == [1] and folder.holds(1)
    assert storage.exists(storage.join(folder.version_uri(1), METADATA_FILE))
    before = _snapshot(root)
    assert not register_run(trained_model, trained_summary, root, "run-b", 0.90).promoted
    assert _snapshot(root) == before  # untouched, the lease included
    assert register_run(trained_model, trained_summary, root, "run-c", 0.97).version == 3
    assert folder.versions() == [3] and folder.matches(3) and folder.alias_version() == 3
    assert folder.store.published_versions() == [1, 2, 3]  # the registry keeps every version


class Crash(BaseException):
    """The process stops here (nothing after it runs, no except clause catches it)."""


@pytest.mark.parametrize("repair", ["next registration", "rerun", "sync-serving"])
def test_a_crash_between_the_swap_and_the_sync_is_repaired(
    trained_model, trained_summary, storage_root, repair: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    root, folder = storage_root, _folder(storage_root)
    register_run(trained_model, trained_summary, root, "run-a", 0.93)

    def crash(self: ServingFolder) -> int | None:
        raise Crash

    with monkeypatch.context() as patch:
        patch.setattr(ServingFolder, "sync", crash)
        with pytest.raises(Crash):
            register_run(trained_model, trained_summary, root, "run-b", 0.97)
    assert folder.alias_version() == 2 and folder.versions() == [1]  # swapped, not synced
    if repair == "next registration":
        assert not register_run(trained_model, trained_summary, root, "run-c", 0.90).promoted
    elif repair == "rerun":
        assert register_run(trained_model, trained_summary, root, "run-b", 0.97).version == 2
    else:
        from pipeline.cli import cli

        result = CliRunner().invoke(cli, ["sync-serving", "--registry-root", root])
        assert result.exit_code == 0, result.output
        assert result.output == f"{folder.uri} holds version 2, the one 'production' names\n"
    assert folder.versions() == [2] and folder.matches(2)


CRASHING_SYNC = """
import os, sys
from components.common import storage
from components.common.failure import ExitCode
from components.register import serving
from components.register.registry import ModelStore
serving.LEASE_SECONDS = 2.0
copies = []
real_copy, real_replace = storage.copy_file, os.replace
def copy_then_die(src, dest):  # GCS: dies after two of the version's files are copied in
    real_copy(src, dest)
    copies.append(dest)
    if len(copies) == 2:
        os._exit(3)
def die_before_the_rename(src, dest):  # local: dies with the copy staged under its dot-name
    if os.path.basename(src).startswith(".2."):
        os._exit(3)
    real_replace(src, dest)
storage.copy_file, os.replace = copy_then_die, die_before_the_rename
serving.ServingFolder(ModelStore(sys.argv[1], "mnist-cnn")).sync()
"""


def test_a_process_killed_in_the_middle_of_a_copy_is_repaired(
    trained_model, trained_summary, storage_root, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A sync killed half way (lease held, version 2 partly copied): no server sees version 2
    partial (locally not at all; on GCS without saved_model.pb), version 1 stays whole, and the
    next sync takes the lease over once it expires and finishes the move."""
    root, folder = storage_root, _folder(storage_root)
    register_run(trained_model, trained_summary, root, "run-a", 0.93)
    with monkeypatch.context() as patch:
        patch.setattr(ServingFolder, "sync", lambda self: None)  # the alias moves, nothing more
        register_run(trained_model, trained_summary, root, "run-b", 0.97)
    proc = subprocess.run(
        [sys.executable, "-c", CRASHING_SYNC, root], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 3, proc.stderr
    assert folder.holds(1) and not folder.holds(2)
    if storage.is_gcs(root):
        assert folder.versions() == [1, 2]  # partial: two files, no saved_model.pb
        assert not storage.exists(storage.join(folder.version_uri(2), SAVED_MODEL_PB))
    else:
        assert folder.versions() == [1]  # the staged copy has a dot-name
        assert [p.name[:3] for p in Path(folder.uri).iterdir() if p.name != "1"] == [".2."]
    assert _folder(root).sync() == 2  # waits out the dead holder's 2 s lease
    assert folder.versions() == [2] and folder.matches(2)
    if not storage.is_gcs(root):
        assert os.listdir(folder.uri) == ["2"]  # the leftovers are gone


def test_one_sync_at_a_time_holds_the_lease(storage_root: str) -> None:
    """While a sync holds the folder's lease no other can take it; once given back, or once a
    dead holder's lease has expired, the next one can."""
    now = [1000.0]
    first, second = (
        ServingFolder(ModelStore(storage_root, "m"), lease_s=10, clock=lambda: now[0])
        for _ in range(2)
    )
    with first._lease():
        assert not second._take("second")
        now[0] += 9.0
        assert not second._take("second")  # 1 s left
    assert second._take("second")  # given back
    now[0] += 10.5  # "second" died holding it: its lease runs out
    assert first._take("first")
    assert storage.read_versioned(first.lease_uri)[0] is not None


def test_sync_serving_without_the_alias_is_one_line_and_writes_nothing(tmp_path: Path) -> None:
    from pipeline.cli import cli

    root = tmp_path / "registry"
    result = CliRunner().invoke(cli, ["sync-serving", "--registry-root", str(root)])
    assert (result.exit_code, result.stdout) == (ExitCode.BAD_INPUT, "")
    assert result.stderr.splitlines() == [
        f"FAILED: alias 'production' does not exist for model 'mnist-cnn' in {root}: "
        f"{root}/mnist-cnn/_serving/production left as it is"
    ]
    assert not root.exists()
