"""One code path for local paths and gs:// (the real client against the GCS emulator)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from components.common import storage


def test_write_read_list_remove(storage_root: str) -> None:
    storage.write_text(storage.join(storage_root, "a/b.txt"), "hello")
    storage.write_bytes(storage.join(storage_root, "a/c/d.bin"), b"\x00\x01")
    assert storage.read_text(storage.join(storage_root, "a/b.txt")) == "hello"
    assert storage.list_files(storage.join(storage_root, "a")) == [
        storage.join(storage_root, "a/b.txt"),
        storage.join(storage_root, "a/c/d.bin"),
    ]
    assert storage.relative_files(storage.join(storage_root, "a") + "/") == ["b.txt", "c/d.bin"]
    storage.remove_tree(storage.join(storage_root, "a"))
    assert storage.list_files(storage.join(storage_root, "a")) == []
    assert not storage.exists(storage.join(storage_root, "a/b.txt"))


def test_missing_file_names_the_uri(storage_root: str) -> None:
    with pytest.raises(FileNotFoundError, match="nope.txt"):
        storage.read_bytes(storage.join(storage_root, "nope.txt"))


def test_create_exclusive_creates_once(storage_root: str) -> None:
    target = storage.join(storage_root, "claims/1.json")
    assert storage.create_exclusive(target, b"first") is True
    assert storage.create_exclusive(target, b"second") is False
    assert storage.read_bytes(target) == b"first"


def test_write_if_unchanged_refuses_a_stale_token(storage_root: str) -> None:
    target = storage.join(storage_root, "aliases/production.json")
    assert storage.read_versioned(target) == (None, storage.ABSENT)
    assert storage.write_if_unchanged(target, b"v1", storage.ABSENT) is True
    assert storage.write_if_unchanged(target, b"again", storage.ABSENT) is False  # exists now
    data, token = storage.read_versioned(target)
    assert data == b"v1"
    assert storage.write_if_unchanged(target, b"v2", token) is True
    assert storage.write_if_unchanged(target, b"v3", token) is False  # token is stale now
    assert storage.read_bytes(target) == b"v2"


def test_upload_and_download_a_tree(storage_root: str, tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "variables").mkdir(parents=True)
    (src / "saved_model.pb").write_bytes(b"pb")
    (src / "variables" / "v.index").write_bytes(b"ix")
    storage.upload_dir(src, storage.join(storage_root, "model"), last="saved_model.pb")
    back = storage.download_dir(storage.join(storage_root, "model"), tmp_path / "back")
    assert (back / "saved_model.pb").read_bytes() == b"pb"
    assert (back / "variables" / "v.index").read_bytes() == b"ix"


def test_local_write_leaves_no_temporary_files(tmp_path: Path) -> None:
    for i in range(3):
        storage.write_text(str(tmp_path / "f.json"), str(i))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f.json"]
    assert storage.read_text(str(tmp_path / "f.json")) == "2"


def test_local_upload_refuses_to_overwrite(tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "x").write_text("new")
    (tmp_path / "dest").mkdir()
    (tmp_path / "dest" / "x").write_text("old")
    with pytest.raises(FileExistsError, match="destination already exists"):
        storage.upload_dir(tmp_path / "src", str(tmp_path / "dest"))
    assert (tmp_path / "dest" / "x").read_text() == "old"


def test_bad_gcs_uris_are_named() -> None:
    with pytest.raises(ValueError, match="gs:// URI has no bucket"):
        storage.split_gcs("gs:///key")
    with pytest.raises(ValueError, match="not a gs:// URI"):
        storage.split_gcs("/local/path")


def test_a_folder_removed_while_it_is_summed_reads_as_absent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A serving sync checks the folder before it takes the lease, while another sync may rename
    a version away: what is gone by the time it is listed or read is absent, as in a GCS
    listing, not an error."""
    folder = tmp_path / "7"
    for rel in ("fingerprint.pb", "saved_model.pb", "variables/variables.index"):
        storage.write_bytes(str(folder / rel), b"x")
    read_bytes = Path.read_bytes

    def read_then_removed(path: Path) -> bytes:
        data = read_bytes(path)
        shutil.rmtree(folder, ignore_errors=True)  # the other sync, right after the first read
        return data

    monkeypatch.setattr(Path, "read_bytes", read_then_removed)
    assert len(storage.checksums(str(folder))) == 1
