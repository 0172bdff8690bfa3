"""The storage access check (`components.common.storage_access`) with the real client: on
fake-gcs-server, behind `standins.fake_gcs.ReadOnlyProxy` where the identity may only read (the
emulator has no IAM), and, in a subprocess, with no credentials at all. The commands that run it
are tested in tests/test_storage_checks.py and components/train/tests/test_trainer_storage.py."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from components.common import storage
from components.common.storage_access import Location, StorageAccessError, check
from tests.conftest import bucket_objects

ROOT = Path(__file__).resolve().parents[3]


def test_a_location_it_can_write_passes_and_the_probe_is_gone(
    gcs_emulator: str, gcs_bucket: str
) -> None:
    storage.write_text(f"gs://{gcs_bucket}/reg/kept.txt", "kept")
    check(
        [
            Location("registry_root", f"gs://{gcs_bucket}/reg", writes=True),
            Location("data_source", f"gs://{gcs_bucket}/reg/kept.txt"),
        ]
    )
    assert bucket_objects(gcs_emulator, gcs_bucket) == ["reg/kept.txt"]


def test_local_paths_are_not_checked(tmp_path: Path) -> None:
    check([Location("registry_root", str(tmp_path / "not-yet"), writes=True)])
    assert not (tmp_path / "not-yet").exists()


@pytest.mark.parametrize("writes", [False, True], ids=["read", "write"])
def test_a_missing_bucket_is_named(gcs_emulator: str, gcs_bucket: str, writes: bool) -> None:
    with pytest.raises(StorageAccessError) as info:
        check([Location("registry_root", f"gs://{gcs_bucket}-missing/reg", writes)])
    assert str(info.value) == (
        f"registry_root gs://{gcs_bucket}-missing/reg: bucket '{gcs_bucket}-missing' does not "
        f"exist; create it (`gcloud storage buckets create gs://{gcs_bucket}-missing`) or "
        "correct the name"
    )
    assert bucket_objects(gcs_emulator, f"{gcs_bucket}-missing") is None


def test_a_read_only_bucket_passes_for_reading_and_is_refused_for_writing(
    gcs_emulator: str, read_only_bucket: str
) -> None:
    uri = f"gs://{read_only_bucket}/reg"
    check([Location("data_source", uri)])
    with pytest.raises(StorageAccessError) as info:
        check([Location("registry_root", uri, writes=True)])
    message = str(info.value)
    assert message.startswith(
        f"registry_root {uri}: this process's identity lacks storage.objects.create on bucket "
        f"'{read_only_bucket}'; grant it roles/storage.objectAdmin on gs://{read_only_bucket} "
    )
    assert "Workload Identity" in message and "docs/cluster.md" in message
    assert "\n" not in message
    assert bucket_objects(gcs_emulator, read_only_bucket) == ["reg/kept.txt"]


def test_no_credentials_is_named_with_how_to_provide_them(no_credentials: dict[str, str]) -> None:
    """In its own process: google-auth reads its environment when imported."""
    program = (
        "from components.common.storage_access import Location, check\n"
        "check([Location('registry_root', 'gs://some-bucket/reg', writes=True)])"
    )
    proc = subprocess.run(
        [sys.executable, "-c", program],
        cwd=ROOT,
        env=no_credentials,
        capture_output=True,
        text=True,
        timeout=120,
    )
    last = proc.stderr.strip().splitlines()[-1]
    assert last == (
        "components.common.storage_access.StorageAccessError: registry_root gs://some-bucket/reg: "
        "this process's identity found no Google credentials to reach bucket 'some-bucket'; "
        "provide Application Default Credentials (`gcloud auth application-default login`, or "
        "GOOGLE_APPLICATION_CREDENTIALS), Workload Identity for the pod's KSA on GKE "
        "(docs/cluster.md section 3), or STORAGE_EMULATOR_HOST for a GCS emulator"
    ), proc.stderr
