"""Whether this process's identity can use a run's ``gs://`` locations (and a local folder it
writes), checked before any work; a failure is one line naming what to fix. Runs in the
pipeline's check step and CLI, each step's pod, and each rank.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from components.common import storage
from components.common.failure import InputError

# For each ``gs://`` location: that Google credentials exist (with ``STORAGE_EMULATOR_HOST`` set the
# client is anonymous against the emulator, as `storage._client` is), that its bucket exists, that
# the identity can read it (list, and get the first object listed) and, where the run writes, write
# there. A failure is one line (`StorageAccessError`, an InputError: an expected error) naming the
# parameter, the bucket, the missing permission or credential and how to provide it.
#
# Writing is checked with a small probe object, created (``ifGenerationMatch=0``, so nothing is ever
# overwritten), read back and deleted again, not with the bucket's ``testIamPermissions``:
# fake-gcs-server, the emulator the tests run on, does not implement that call (it answers 404 for a
# bucket that exists), so a check built on it could not be tested here; the probe takes the same
# create, get and delete calls the run makes (the registry's compare-and-swap and the checkpoints'
# cleanup delete too), on any GCS. The probe's name starts with `PROBE_PREFIX`.
#
# A local folder a run writes (``run-local --root``, a local ``registry_root``) is checked with the
# same rigour (`check_local_folder`): it exists or can be made, and a probe file can be written in
# it (or in the folder it would be made in) and removed.
PROBE_PREFIX = ".kfp-horovod-access-check-"
ROLE = "roles/storage.objectAdmin"
HOW_CREDENTIALS = (
    "provide Application Default Credentials (`gcloud auth application-default login`, or "
    "GOOGLE_APPLICATION_CREDENTIALS), Workload Identity for the pod's KSA on GKE "
    "(docs/cluster.md section 3), or STORAGE_EMULATOR_HOST for a GCS emulator"
)
THIS_IDENTITY = "this process's identity"
WORKERS = "the workers' identity"


class StorageAccessError(InputError):
    """A ``gs://`` location this identity cannot use; the message is one line saying why."""


@dataclass(frozen=True)
class Location:
    """A location a run uses: the parameter (or option) naming it, its URI, and whether the run
    writes there (else it only reads)."""

    name: str
    uri: str
    writes: bool = False


def check(locations: Iterable[Location], identity: str = THIS_IDENTITY) -> None:
    """Raise StorageAccessError for the first ``gs://`` location that `identity` cannot read,
    or write where it `writes`, and for the first local folder written (`check_local_folder`)
    that cannot be; local paths only read are left to their readers."""
    for location in locations:
        if storage.is_gcs(location.uri):
            _check_one(location, identity)
        elif location.writes and location.uri and "://" not in location.uri:
            check_local_folder(location.name, location.uri)


def check_local_folder(name: str, folder: str | Path) -> None:
    """StorageAccessError, one line naming `name`, unless `folder` is a local folder this
    process can write in, or can make: its nearest existing folder takes a probe file (named
    `PROBE_PREFIX`...), which is removed again. Nothing is made or left behind, whatever the
    outcome."""
    path = Path(folder).absolute()
    existing = path
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    head = f"{name} {folder}"
    if not existing.is_dir():
        where = "is a file" if existing == path else f"cannot be made: {existing} is a file"
        raise StorageAccessError(f"{head}: {where}, not a folder")
    try:
        handle, probe = tempfile.mkstemp(prefix=PROBE_PREFIX, dir=existing)
    except OSError as exc:
        where = "there" if existing == path else f"in {existing}, where it would be made"
        raise StorageAccessError(
            f"{head}: this process cannot write {where} ({exc.strerror or exc}); choose a "
            "folder it can write, or give it write access"
        ) from None
    os.close(handle)
    os.unlink(probe)


def check_job(config: Any, writes: bool) -> None:
    """A training job's check before its first step, with the workers' identity: `config` (a
    TrainConfig)'s data can be read and, with `writes` (rank 0), its output, TensorBoard,
    checkpoint and model locations written."""
    outputs = {
        "output": config.output,
        "output (TensorBoard)": config.tensorboard_uri,
        "checkpoint_dir": config.checkpoint_uri,
        "model_dir": config.model_uri,
    }
    locations = [Location("data", config.data)]
    locations += [Location(n, uri, writes=True) for n, uri in outputs.items()] if writes else []
    check(locations, WORKERS)


def _check_one(location: Location, identity: str) -> None:
    bucket_name, key = storage.split_gcs(location.uri)
    failed = _Failure(location, bucket_name, identity)
    try:
        client = storage._client()  # the run's own client: anonymous against an emulator
    except Exception as exc:
        if not _is_auth_error(exc):
            raise
        raise failed.credentials(exc) from None
    retry = storage._retry("access check", location.uri)
    bucket = client.bucket(bucket_name)
    listed = failed.calling(
        "storage.objects.list",
        lambda: list(client.list_blobs(bucket, prefix=key, max_results=1, retry=retry)),
    )
    if listed:  # its first object; NotFound here: deleted since it was listed
        get = listed[0].reload
        failed.calling("storage.objects.get", lambda: get(retry=retry), vanishes=True)
    if not location.writes:
        return
    probe = bucket.blob(storage.join(key, PROBE_PREFIX + uuid.uuid4().hex).lstrip("/"))
    failed.calling("storage.objects.create", lambda: _create(probe, retry))
    failed.calling("storage.objects.get", lambda: probe.reload(retry=retry))
    left = f" (the probe object gs://{bucket_name}/{probe.name} is left there)"
    # NotFound: a retried delete whose first attempt went through
    delete = probe.delete
    failed.calling("storage.objects.delete", lambda: delete(retry=retry), left, vanishes=True)


def _create(probe: Any, retry: Any) -> None:
    """Create the empty `probe` unless it exists (412: a retried create whose first attempt
    went through; the name is new, so nothing else can hold it)."""
    from google.api_core import exceptions

    with contextlib.suppress(exceptions.PreconditionFailed):
        probe.upload_from_string(b"", if_generation_match=0, retry=retry)


def _is_auth_error(exc: BaseException) -> bool:
    """Whether `exc` says this process has no Google credentials, or none that work."""
    from google.auth import exceptions  # lazily, as the storage client

    kinds = (exceptions.DefaultCredentialsError, exceptions.RefreshError, exceptions.TransportError)
    return isinstance(exc, kinds)


@dataclass(frozen=True)
class _Failure:
    """The one line of a location's failure."""

    location: Location
    bucket: str
    identity: str

    @property
    def head(self) -> str:
        return f"{self.location.name} {self.location.uri}"

    def credentials(self, exc: BaseException) -> StorageAccessError:
        from google.auth.exceptions import DefaultCredentialsError

        why = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        what = (
            "found no Google credentials"
            if isinstance(exc, DefaultCredentialsError)
            else f"its Google credentials do not work ({why})"
        )
        return StorageAccessError(
            f"{self.head}: {self.identity} {what} to reach bucket {self.bucket!r}; "
            f"{HOW_CREDENTIALS}"
        )

    def calling(
        self, permission: str, call: Callable[[], Any], note: str = "", vanishes: bool = False
    ) -> Any:
        """`call`'s result; StorageAccessError if it was refused: the bucket is missing, the
        identity lacks `permission`, or its credentials do not work. With `vanishes`, a
        NotFound is an object already gone: None."""
        from google.api_core import exceptions

        try:
            return call()
        except exceptions.NotFound:
            if vanishes:
                return None
            raise StorageAccessError(
                f"{self.head}: bucket {self.bucket!r} does not exist; create it (`gcloud storage "
                f"buckets create gs://{self.bucket}`) or correct the name"
            ) from None
        except exceptions.Forbidden:
            raise StorageAccessError(
                f"{self.head}: {self.identity} lacks {permission} on bucket {self.bucket!r}"
                f"{note}; grant it {ROLE} on gs://{self.bucket} (on GKE: to the Google service "
                "account Workload Identity maps the pod's KSA to, docs/cluster.md section 3; "
                "else to the account of your Application Default Credentials)"
            ) from None
        except exceptions.Unauthorized as exc:
            raise self.credentials(exc) from None
        except Exception as exc:
            if not _is_auth_error(exc):
                raise
            raise self.credentials(exc) from None
