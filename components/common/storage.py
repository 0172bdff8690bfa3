"""One code path for local paths and ``gs://`` URIs (``google-cloud-storage``, which honours
``STORAGE_EMULATOR_HOST``). Every write is all-or-nothing: a local file is written to a
temporary name and renamed; a GCS object appears only when its upload completes. Used by every
process that reads or writes a run's files: each step's pod, each rank and the pipeline's CLI.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterator
from functools import lru_cache
from pathlib import Path
from typing import Any

from components.common.failure import InputError

# The compare-and-swap token of a file that does not exist (GCS's ifGenerationMatch=0).
ABSENT = "0"
# Each retry's log line (the operation may be several words: "access check"), and the pattern
# that finds one in a job's log (bench.faults counts them against the faults it injected).
RETRY_FORMAT = "GCS %s %s failed: %s; retrying"
RETRY_LINE = re.compile(r"GCS [\w ]+ \S+ failed: .*; retrying")
_log = logging.getLogger(__name__)


def is_gcs(uri: str) -> bool:
    return uri.startswith("gs://")


def join(uri: str, *parts: str) -> str:
    out = uri
    for part in parts:
        out = out.rstrip("/") + "/" + part.lstrip("/")
    return out


def split_gcs(uri: str) -> tuple[str, str]:
    """``gs://bucket/a/b`` -> ``("bucket", "a/b")``."""
    if not is_gcs(uri):
        raise InputError(f"not a gs:// URI: {uri!r}")
    bucket, _, key = uri.removeprefix("gs://").partition("/")
    if not bucket:
        raise InputError(f"gs:// URI has no bucket: {uri!r}")
    return bucket, key


@lru_cache(maxsize=1)
def _client() -> Any:
    from google.cloud import storage  # imported lazily: local-only users need no GCS stack

    # With STORAGE_EMULATOR_HOST set, the client talks to that emulator without credentials.
    return storage.Client()


def _blob(uri: str) -> Any:
    bucket, key = split_gcs(uri)
    return _client().bucket(bucket).blob(key)


# Every GCS request retries transient errors with the client's own policy (`_retry`), logging each
# retry once. That is safe for every call here: reads, lists and deletes are idempotent; uploads and
# copies write the same bytes again; and a conditional write whose first attempt reached the server
# fails its generation precondition (412) on the retry instead of writing twice.
def _retry(operation: str, uri: str) -> Any:
    """GCS's own retry, ``DEFAULT_RETRY`` (its predicate, back-off and timeout), logging each
    retry once. What the storage client does with a ``retry`` is wrap each request in it,
    ``retry(request)``; this wraps it through ``Retry.__call__``'s documented ``on_error``,
    so nothing of the Retry is copied or read (tests/test_gcs_faults.py checks that 429 and
    503 are retried and logged)."""
    from google.cloud.storage.retry import DEFAULT_RETRY

    def log_retry(exc: Exception) -> None:
        # An API error's HTTP status is its `code`; google-resumable-media's, its response's.
        response = getattr(exc, "response", None)
        status = getattr(exc, "code", None) or getattr(response, "status_code", None)
        name = type(exc).__name__
        what = f"HTTP {status} ({name})" if isinstance(status, int) else f"{name}: {exc}"
        _log.warning(RETRY_FORMAT, operation, uri, what)

    def retried(request: Callable[..., Any]) -> Callable[..., Any]:
        return DEFAULT_RETRY(request, on_error=log_retry)

    return retried


def _gcs_errors() -> Any:
    from google.api_core import exceptions  # lazily, as `_client`

    return exceptions


def exists(uri: str) -> bool:
    """Whether the file (or, locally, the directory) exists."""
    if is_gcs(uri):
        return bool(_blob(uri).exists(retry=_retry("exists", uri)))
    return os.path.exists(uri)


def read_bytes(uri: str) -> bytes:
    """A whole file; FileNotFoundError naming the URI if it is missing."""
    if not is_gcs(uri):
        return Path(uri).read_bytes()  # its FileNotFoundError names the path
    try:
        return bytes(_blob(uri).download_as_bytes(retry=_retry("read", uri)))
    except _gcs_errors().NotFound as exc:
        raise FileNotFoundError(f"no such object: {uri}") from exc


@contextlib.contextmanager
def open_read(uri: str) -> Iterator[Any]:
    """A binary stream of the file at `uri` (GCS: downloaded in chunks as it is read, each
    request retried); FileNotFoundError naming the URI if it is missing."""
    if not is_gcs(uri):
        with open(uri, "rb") as fh:  # its FileNotFoundError names the path
            yield fh
        return
    try:
        stream = _blob(uri).open("rb", chunk_size=8 * 2**20, retry=_retry("read", uri))
    except _gcs_errors().NotFound as exc:
        raise FileNotFoundError(f"no such object: {uri}") from exc
    with stream:
        yield stream


def read_text(uri: str) -> str:
    return read_bytes(uri).decode("utf-8")


def _write_beside(path: Path, data: bytes) -> Path:
    """A new temporary file in `path`'s folder holding `data`, flushed to disk."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return Path(tmp)


def _upload(uri: str, data: bytes, operation: str, generation: int | None = None) -> bool:
    """One GCS upload (``ifGenerationMatch=generation`` when given); False if that failed."""
    try:
        _blob(uri).upload_from_string(
            data, if_generation_match=generation, retry=_retry(operation, uri)
        )
    except _gcs_errors().PreconditionFailed:
        return False
    return True


def write_bytes(uri: str, data: bytes) -> None:
    """Write a whole file atomically."""
    if is_gcs(uri):
        _upload(uri, data, "write")
        return
    tmp = _write_beside(Path(uri), data)
    try:
        os.replace(tmp, uri)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_text(uri: str, text: str) -> None:
    write_bytes(uri, text.encode("utf-8"))


def create_exclusive(uri: str, data: bytes) -> bool:
    """Create a file only if it does not exist yet; False if it already did.

    Locally a temporary file is hard-linked into place (atomic, and fails if `uri` exists). On
    GCS a retry whose first attempt was written but not answered is refused (412) and reported
    as "existed", which the callers tolerate (a claimed version is skipped, a run binding is
    read back).
    """
    if is_gcs(uri):
        return _upload(uri, data, "create", generation=0)
    tmp = _write_beside(Path(uri), data)
    try:
        os.link(tmp, uri)
    except FileExistsError:
        return False
    finally:
        tmp.unlink(missing_ok=True)
    return True


def _listing(uri: str) -> Iterator[tuple[str, Any]]:
    """Every file below `uri` as (path relative to `uri`, its blob on GCS or its Path)."""
    if is_gcs(uri):
        bucket, key = split_gcs(uri)
        prefix = key.rstrip("/") + "/" if key else ""
        for blob in _client().list_blobs(bucket, prefix=prefix, retry=_retry("list", uri)):
            yield blob.name[len(prefix) :], blob
    else:  # os.walk skips a folder removed while it is listed, as a GCS listing does
        for folder, _, names in os.walk(uri):
            for name in names:
                path = Path(folder, name)
                yield path.relative_to(uri).as_posix(), path


def relative_files(uri: str) -> list[str]:
    """All files below a directory or prefix, as sorted paths relative to it (``a/b.npy``)."""
    return sorted(rel for rel, _ in _listing(uri))


def list_files(uri: str) -> list[str]:
    """All files below a directory or prefix, as sorted full URIs."""
    return [join(uri, rel) for rel in relative_files(uri)]


def sizes(uri: str) -> dict[str, int]:
    """Relative path -> bytes of every file below `uri` (GCS: from the listing)."""
    if is_gcs(uri):
        return {rel: int(blob.size) for rel, blob in _listing(uri)}
    return {rel: path.stat().st_size for rel, path in _listing(uri)}


def checksums(uri: str) -> dict[str, str]:
    """Relative path -> checksum of every file below `uri` (GCS: the listing's crc32c, nothing
    downloaded; locally: sha256)."""
    if is_gcs(uri):
        return {rel: str(blob.crc32c) for rel, blob in _listing(uri)}
    sums = {}
    for rel, path in _listing(uri):
        with contextlib.suppress(FileNotFoundError):  # removed since listed: absent, as on GCS
            sums[rel] = sha256_bytes(path.read_bytes())
    return sums


def copy_file(src: str, dest: str) -> None:
    """A server-side copy of one GCS object."""
    source, target = _blob(src), _blob(dest)
    retry = _retry("copy", dest)
    token, _, _ = target.rewrite(source, retry=retry)
    while token is not None:  # large objects take several rewrite calls
        token, _, _ = target.rewrite(source, token=token, retry=retry)


def upload_file(local: str | Path, uri: str) -> None:
    """Copy one local file to `uri`, all or nothing (GCS: the client checks its CRC32C)."""
    if is_gcs(uri):
        _blob(uri).upload_from_filename(str(local), retry=_retry("upload", uri))
        return
    dest = Path(uri)
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".tmp", dir=dest.parent)
    os.close(fd)
    try:
        shutil.copyfile(local, tmp)
        os.replace(tmp, dest)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def download_file(uri: str, local: str | Path) -> None:
    """Copy the file at `uri` to `local` (GCS: the client checks its CRC32C);
    FileNotFoundError naming the URI if it is missing."""
    Path(local).parent.mkdir(parents=True, exist_ok=True)
    if not is_gcs(uri):
        shutil.copyfile(uri, local)  # its FileNotFoundError names the path
        return
    try:
        _blob(uri).download_to_filename(str(local), retry=_retry("download", uri))
    except _gcs_errors().NotFound as exc:
        Path(local).unlink(missing_ok=True)  # nothing left behind under its name
        raise FileNotFoundError(f"no such object: {uri}") from exc


def remove_file(uri: str) -> None:
    """Delete one file; missing is fine."""
    if not is_gcs(uri):
        Path(uri).unlink(missing_ok=True)
        return
    with contextlib.suppress(_gcs_errors().NotFound):  # a retried delete that went through
        _blob(uri).delete(retry=_retry("delete", uri))


def upload_dir(
    local_dir: str | Path, uri: str, last: str | None = None, staging: str | None = None
) -> None:
    """Copy a local directory tree to `uri`.

    Locally the tree is staged beside `uri` (which must not exist) and renamed into place.
    GCS has no atomic rename of a prefix: the file named `last` (e.g. ``saved_model.pb``) is
    written after every other, so a reader keyed on it never sees a partial tree. With
    `staging` (a GCS prefix readers ignore) the files are uploaded there first, then copied
    server-side into `uri`: `uri` is then incomplete only while those copies run, not during
    the upload, and never after an upload that failed.
    """
    if is_gcs(uri):
        rels = sorted((rel for rel, _ in _listing(str(local_dir))), key=lambda r: (r == last, r))
        for rel in rels:
            target = join(staging or uri, rel)
            _blob(target).upload_from_filename(
                str(Path(local_dir, rel)), retry=_retry("upload", target)
            )
        if staging is not None:
            for rel in rels:
                copy_file(join(staging, rel), join(uri, rel))
            remove_tree(staging)
        return
    dest = Path(uri)
    if dest.exists():
        raise FileExistsError(f"destination already exists: {dest}")
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=dest.parent))
    try:
        shutil.copytree(local_dir, tmp, dirs_exist_ok=True)
        os.replace(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def download_dir(uri: str, local_dir: str | Path) -> Path:
    """Copy everything below `uri` into `local_dir` (created); return it."""
    local_dir = Path(local_dir)
    local_dir.mkdir(parents=True, exist_ok=True)
    if not is_gcs(uri):
        shutil.copytree(uri, local_dir, dirs_exist_ok=True)
        return local_dir
    for rel, blob in _listing(uri):
        target = local_dir / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        blob.download_to_filename(str(target), retry=_retry("download", join(uri, rel)))
    return local_dir


def remove_tree(uri: str, last: str | None = None, first: str | None = None) -> None:
    """Delete a directory tree or prefix; missing is fine. On GCS the file named `last` (as in
    `upload_dir`) goes after every other, so a delete cut short never leaves files without their
    marker; `first` goes before every other (its readers stop seeing the tree at once)."""
    if not is_gcs(uri):
        shutil.rmtree(uri, ignore_errors=True)
        return
    for rel, blob in sorted(_listing(uri), key=lambda item: (item[0] != first, item[0] == last)):
        with contextlib.suppress(_gcs_errors().NotFound):  # a retried delete that went through
            blob.delete(retry=_retry("delete", join(uri, rel)))


# Compare-and-swap for small control files (registry aliases, leases). A token identifies the
# content a caller read: the object generation on GCS, the sha256 of the bytes locally.


def read_versioned(uri: str) -> tuple[bytes | None, str]:
    """A small file with its compare-and-swap token; ``(None, ABSENT)`` if missing."""
    if not is_gcs(uri):
        try:
            data = Path(uri).read_bytes()
        except FileNotFoundError:
            return None, ABSENT
        return data, sha256_bytes(data)
    bucket, key = split_gcs(uri)
    errors = _gcs_errors()
    for _ in range(5):  # the object may be replaced between the metadata read and download
        blob = _client().bucket(bucket).get_blob(key, retry=_retry("stat", uri))
        if blob is None:
            return None, ABSENT
        generation = blob.generation  # read before the download, which may reset it
        try:
            data = blob.download_as_bytes(if_generation_match=generation, retry=_retry("read", uri))
        except (errors.NotFound, errors.PreconditionFailed):
            continue
        return bytes(data), str(generation)
    raise RuntimeError(f"{uri}: kept changing while being read")


def write_if_unchanged(uri: str, data: bytes, token: str) -> bool:
    """Replace `uri` with `data` only if it still holds what was read with `token`; False (and
    nothing written) if someone changed it since.

    On GCS a retry whose first attempt was written but not answered is refused too: the caller
    re-reads and finds its own record. Locally the check and the rename run under an ``flock``
    on a sidecar file (released by the kernel if the process dies).
    """
    if is_gcs(uri):
        return _upload(uri, data, "write", generation=int(token))
    path = Path(uri)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.parent / f".{path.name}.lock", "a+b") as lock:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)  # released when the file closes
        if read_versioned(uri)[1] != token:
            return False
        write_bytes(uri, data)
        return True


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def crc32c_base64(data: bytes) -> str:
    """`data`'s CRC32C as GCS reports an object's (base64 of the big-endian value), to check
    a written object against its listing without reading it back."""
    import base64

    import google_crc32c

    return base64.b64encode(google_crc32c.Checksum(data).digest()).decode("ascii")
