"""One code path for local paths and ``gs://`` URIs.

Local paths are used as they are; ``gs://bucket/key`` goes through ``google-cloud-storage``
(which honours ``STORAGE_EMULATOR_HOST``, so tests run against ``fake-gcs-server``).
Every write is all-or-nothing: local files are written to a temporary name and renamed, and a
GCS object appears only when its upload completes.

Every GCS request retries transient errors (429, 408, 5xx, dropped connections) with the
client library's own policy, google-api-core's ``Retry`` with ``DEFAULT_RETRY``'s predicate and
exponential back-off, and each retry is logged once, naming the operation, the object and the
error (`_retry`). Retrying is safe for every call here: reads, lists and deletes are
idempotent; plain uploads (`write_bytes`, `upload_dir`) write objects that have one writer and
the same bytes on every attempt; a retried server-side copy writes the same object again; and
the conditional writes carry a generation precondition, so a retry whose first attempt did
reach the server fails the precondition (412) instead of writing twice (what the callers do
then is in `create_exclusive` and `write_if_unchanged`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import tempfile
from collections.abc import Iterator
from functools import lru_cache
from pathlib import Path
from typing import Any

GCS_SCHEME = "gs://"
_log = logging.getLogger(__name__)


class StorageError(RuntimeError):
    """A read or write failed; the message names the URI."""


def is_gcs(uri: str) -> bool:
    """True for ``gs://`` URIs."""
    return uri.startswith(GCS_SCHEME)


def join(uri: str, *parts: str) -> str:
    """Join path segments onto a local path or a ``gs://`` URI."""
    out = uri
    for part in parts:
        out = out.rstrip("/") + "/" + part.lstrip("/")
    return out


def split_gcs(uri: str) -> tuple[str, str]:
    """``gs://bucket/a/b`` -> ``("bucket", "a/b")``."""
    if not is_gcs(uri):
        raise ValueError(f"not a gs:// URI: {uri!r}")
    bucket, _, key = uri[len(GCS_SCHEME) :].partition("/")
    if not bucket:
        raise ValueError(f"gs:// URI has no bucket: {uri!r}")
    return bucket, key


@lru_cache(maxsize=1)
def _client() -> Any:
    from google.cloud import storage  # imported lazily: local-only users need no GCS stack

    if os.environ.get("STORAGE_EMULATOR_HOST"):
        from google.auth.credentials import AnonymousCredentials

        return storage.Client(project="emulator", credentials=AnonymousCredentials())
    return storage.Client()


def _blob(uri: str) -> Any:
    bucket, key = split_gcs(uri)
    return _client().bucket(bucket).blob(key)


def _describe(exc: BaseException) -> str:
    """``HTTP 503 (ServiceUnavailable)`` for an HTTP error, else the exception's type and text."""
    status = getattr(exc, "code", None)
    response = getattr(exc, "response", None)
    if not isinstance(status, int) and response is not None:
        status = getattr(response, "status_code", None)
    if isinstance(status, int):
        return f"HTTP {status} ({type(exc).__name__})"
    return f"{type(exc).__name__}: {exc}"


def _retry(operation: str, uri: str) -> Any:
    """The retry policy of one GCS call: ``DEFAULT_RETRY``'s predicate and back-off (a random
    wait of up to 1 s, doubling to 60 s, for up to 120 s in all), logging each retry once."""
    from google.api_core.retry import Retry
    from google.cloud.storage.retry import DEFAULT_RETRY

    def log_retry(exc: Exception) -> None:
        _log.warning("GCS %s %s failed: %s; retrying", operation, uri, _describe(exc))

    # google-api-core has no public copy-with-on_error; DEFAULT_RETRY's predicate is reused as
    # it is (components/common/tests/test_storage.py checks that it retries 429 and 503).
    return Retry(
        predicate=DEFAULT_RETRY._predicate, timeout=DEFAULT_RETRY.timeout, on_error=log_retry
    )


def exists(uri: str) -> bool:
    """True if the file (or, locally, the directory) exists."""
    if is_gcs(uri):
        return bool(_blob(uri).exists(retry=_retry("exists", uri)))
    return os.path.exists(uri)


def read_bytes(uri: str) -> bytes:
    """Read a whole file. Raises FileNotFoundError naming the URI if it is missing."""
    if is_gcs(uri):
        from google.api_core import exceptions as gexc

        try:
            return bytes(_blob(uri).download_as_bytes(retry=_retry("read", uri)))
        except gexc.NotFound as exc:
            raise FileNotFoundError(f"no such object: {uri}") from exc
    try:
        return Path(uri).read_bytes()
    except FileNotFoundError as exc:
        raise FileNotFoundError(f"no such file: {uri}") from exc


def read_text(uri: str) -> str:
    """Read a UTF-8 text file."""
    return read_bytes(uri).decode("utf-8")


def _write_beside(path: Path, data: bytes) -> Path:
    """Write `data` to a new temporary file in `path`'s folder (flushed to disk); return it."""
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


def write_bytes(uri: str, data: bytes) -> None:
    """Write a whole file atomically (temporary name + rename locally, one upload on GCS)."""
    if is_gcs(uri):
        _blob(uri).upload_from_string(data, retry=_retry("write", uri))
        return
    path = Path(uri)
    tmp = _write_beside(path, data)
    try:
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_text(uri: str, text: str) -> None:
    """Write a UTF-8 text file atomically."""
    write_bytes(uri, text.encode("utf-8"))


def create_exclusive(uri: str, data: bytes) -> bool:
    """Create a file only if it does not exist yet; False if it already did.

    Locally this is ``O_CREAT | O_EXCL`` (the content is written to a temporary file and
    hard-linked into place, so nobody sees a half-written file). On GCS it is an upload with
    the precondition ``ifGenerationMatch=0``, retried like every call: a retry whose first
    attempt was written but not answered is refused (412) and reported as "existed", which
    the callers tolerate (a claimed version is skipped, a run binding is read back).
    """
    if is_gcs(uri):
        from google.api_core import exceptions as gexc

        try:
            _blob(uri).upload_from_string(data, if_generation_match=0, retry=_retry("create", uri))
        except gexc.PreconditionFailed:
            return False
        return True
    path = Path(uri)
    tmp = _write_beside(path, data)
    try:
        os.link(tmp, path)  # atomic, and fails if `path` exists
    except FileExistsError:
        return False
    finally:
        tmp.unlink(missing_ok=True)
    return True


def list_files(uri: str) -> list[str]:
    """All files below a directory or prefix, as full URIs, sorted."""
    if is_gcs(uri):
        bucket, key = split_gcs(uri)
        prefix = key.rstrip("/") + "/" if key else ""
        blobs = _client().list_blobs(bucket, prefix=prefix, retry=_retry("list", uri))
        return sorted(f"{GCS_SCHEME}{bucket}/{b.name}" for b in blobs)
    root = Path(uri)
    if not root.is_dir():
        return []
    return sorted(str(p) for p in root.rglob("*") if p.is_file())


def checksums(uri: str) -> dict[str, str]:
    """Every file below `uri`: its relative path -> a checksum of its content (GCS: the crc32c
    of the listing, nothing downloaded; locally: the sha256 of its bytes)."""
    prefix = uri.rstrip("/") + "/"
    if is_gcs(uri):
        bucket, key = split_gcs(uri)
        blobs = _client().list_blobs(
            bucket, prefix=key.rstrip("/") + "/", retry=_retry("list", uri)
        )
        return {f"{GCS_SCHEME}{bucket}/{b.name}"[len(prefix) :]: str(b.crc32c) for b in blobs}
    return {p[len(prefix) :]: _sha256(Path(p).read_bytes()) for p in list_files(uri)}


def copy_file(src: str, dest: str) -> None:
    """Copy one file: a server-side copy on GCS (both sides ``gs://``), else a local copy that
    appears whole (temporary name + rename)."""
    if is_gcs(src) and is_gcs(dest):
        source, target = _blob(src), _blob(dest)
        retry = _retry("copy", dest)
        token, _, _ = target.rewrite(source, retry=retry)
        while token is not None:  # large objects take several rewrite calls
            token, _, _ = target.rewrite(source, token=token, retry=retry)
        return
    if is_gcs(src) or is_gcs(dest):
        raise ValueError(f"copy_file copies within one side: {src} -> {dest}")
    tmp = _write_beside(Path(dest), Path(src).read_bytes())
    os.replace(tmp, dest)


def _walk_local(local_dir: Path) -> Iterator[tuple[Path, str]]:
    for path in sorted(local_dir.rglob("*")):
        if path.is_file():
            yield path, path.relative_to(local_dir).as_posix()


def upload_dir(
    local_dir: str | Path, uri: str, last: str | None = None, staging: str | None = None
) -> None:
    """Copy a local directory tree to `uri`.

    Locally the tree is staged next to the destination and renamed into place, so the
    destination appears complete or not at all (it must not exist yet); `staging` is not used.

    GCS has no atomic rename of a prefix, so `uri` cannot appear all at once. The file named
    `last` (relative path, e.g. ``saved_model.pb``) is written after every other file is
    complete, so a reader that keys on it never sees a partial tree. With `staging` (a GCS
    prefix that readers of `uri` ignore), the files are first uploaded there, then copied
    server-side into `uri` (`last` last) and the staged copy is deleted: `uri` then exists
    incomplete only while those copies run, not during the upload, and not at all after an
    upload that failed.
    """
    local_dir = Path(local_dir)
    if is_gcs(uri):
        files = sorted(_walk_local(local_dir), key=lambda item: item[1] == last)
        for path, rel in files:
            target = join(staging or uri, rel)
            _blob(target).upload_from_filename(str(path), retry=_retry("upload", target))
        if staging is not None:
            _move_objects(staging, uri, [rel for _, rel in files])
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


def _move_objects(src: str, dest: str, rels: list[str]) -> None:
    """Server-side copy of ``src/<rel>`` to ``dest/<rel>`` in the order given, then delete src."""
    from google.api_core import exceptions as gexc

    for rel in rels:
        copy_file(join(src, rel), join(dest, rel))
    for rel in rels:
        with contextlib.suppress(gexc.NotFound):  # a retried delete whose first try went through
            _blob(join(src, rel)).delete(retry=_retry("delete", join(src, rel)))


def download_dir(uri: str, local_dir: str | Path) -> Path:
    """Copy everything below `uri` into `local_dir` (created). Returns `local_dir`."""
    local_dir = Path(local_dir)
    local_dir.mkdir(parents=True, exist_ok=True)
    if not is_gcs(uri):
        shutil.copytree(uri, local_dir, dirs_exist_ok=True)
        return local_dir
    prefix = uri.rstrip("/") + "/"
    for file_uri in list_files(uri):
        target = local_dir / file_uri[len(prefix) :]
        target.parent.mkdir(parents=True, exist_ok=True)
        _blob(file_uri).download_to_filename(str(target), retry=_retry("download", file_uri))
    return local_dir


def local_copy(uri: str, workdir: str | Path) -> Path:
    """A local directory holding the tree at `uri`: the path itself when local, else a download."""
    if not is_gcs(uri):
        return Path(uri)
    return download_dir(uri, Path(workdir))


def remove_tree(uri: str, last: str | None = None, first: str | None = None) -> None:
    """Delete a directory tree or prefix; missing is fine. On GCS the file named `last` (as in
    `upload_dir`) goes after every other, so a delete cut short never leaves files without the
    file that marks them for their readers; the file named `first` goes before every other (a
    reader keyed on it stops seeing the tree at once)."""
    if is_gcs(uri):
        from google.api_core import exceptions as gexc

        marker, head = join(uri, last) if last else None, join(uri, first) if first else None
        for file_uri in sorted(list_files(uri), key=lambda f: (f != head, f == marker)):
            with contextlib.suppress(gexc.NotFound):  # a retried delete that went through
                _blob(file_uri).delete(retry=_retry("delete", file_uri))
        return
    shutil.rmtree(uri, ignore_errors=True)


# Compare-and-swap for small control files (registry aliases). A token identifies the content
# a caller read: the object generation on GCS, the sha256 of the bytes locally. ABSENT means
# "the file does not exist" (GCS's ifGenerationMatch=0).
ABSENT = "0"


def read_versioned(uri: str) -> tuple[bytes | None, str]:
    """Read a small file together with its compare-and-swap token; ``(None, ABSENT)`` if missing."""
    if is_gcs(uri):
        from google.api_core import exceptions as gexc

        bucket, key = split_gcs(uri)
        for _ in range(5):  # the object may be replaced between the metadata read and download
            blob = _client().bucket(bucket).get_blob(key, retry=_retry("stat", uri))
            if blob is None:
                return None, ABSENT
            generation = blob.generation  # read before the download, which may reset it
            try:
                data = blob.download_as_bytes(
                    if_generation_match=generation, retry=_retry("read", uri)
                )
            except (gexc.NotFound, gexc.PreconditionFailed):
                continue
            return bytes(data), str(generation)
        raise StorageError(f"{uri}: kept changing while being read")
    try:
        data = Path(uri).read_bytes()
    except FileNotFoundError:
        return None, ABSENT
    return data, _sha256(data)


def write_if_unchanged(uri: str, data: bytes, token: str) -> bool:
    """Replace `uri` with `data` only if it still holds what was read with `token`.

    Returns False (and writes nothing) when someone else changed the file since. On GCS this is
    an upload with ``ifGenerationMatch=token`` (a retry whose first attempt was written but not
    answered is refused too: the caller re-reads and finds its own record); locally the check
    and the atomic rename run under an ``flock`` on a sidecar lock file (released by the kernel
    if the process dies).
    """
    if is_gcs(uri):
        from google.api_core import exceptions as gexc

        try:
            _blob(uri).upload_from_string(
                data, if_generation_match=int(token), retry=_retry("write", uri)
            )
        except gexc.PreconditionFailed:
            return False
        return True
    import fcntl

    path = Path(uri)
    path.parent.mkdir(parents=True, exist_ok=True)
    lock_path = path.parent / f".{path.name}.lock"
    with open(lock_path, "a+b") as lock:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
        try:
            _, current = read_versioned(uri)
            if current != token:
                return False
            write_bytes(uri, data)
            return True
        finally:
            fcntl.flock(lock.fileno(), fcntl.LOCK_UN)


def _sha256(data: bytes) -> str:
    import hashlib

    return hashlib.sha256(data).hexdigest()
