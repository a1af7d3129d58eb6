"""Atomic writes to a local path or any fsspec URL: readers never see half a file.

How a file appears whole depends on the storage:
  - a local file system: a temporary sibling, then ``os.replace`` (atomic on POSIX);
  - an object store (S3, GCS, Azure): the key itself, in one upload that the store makes
    visible only when it completes (S3 multipart uploads, GCS resumable uploads). No
    temporary key, so no server-side copy of what was just uploaded; a failed write aborts
    the upload and leaves nothing;
  - anything else (HDFS, memory://, ...): a temporary sibling, then the file system's move.
Data goes through in blocks, so a multi-GiB file never sits in memory.
"""

from __future__ import annotations

import contextlib
import errno
import io
import os
import uuid
from collections.abc import Iterable, Iterator

import fsspec
from fsspec.implementations.local import LocalFileSystem

# Stores whose writes become visible only when the upload completes.
OBJECT_STORE_PROTOCOLS = frozenset({"s3", "s3a", "gs", "gcs", "az", "abfs", "abfss", "adl"})
# Upload part size for streamed writes: S3's minimum part is 5 MiB; s3fs's default (50 MiB)
# would be that much memory per open upload.
UPLOAD_BLOCK_BYTES = 8 << 20


# What a store's client raises when nothing answered at its address (botocore/aiobotocore, aiohttp,
# requests): named, so that this module imports none of them.
_UNREACHABLE_ERRORS = frozenset({"EndpointConnectionError", "ConnectTimeoutError", "ClientConnectorError",
                                 "ConnectTimeout"})
_UNREACHABLE_ERRNOS = frozenset({errno.ECONNREFUSED, errno.EHOSTUNREACH, errno.ENETUNREACH, errno.ETIMEDOUT})


def store_unreachable(exc: BaseException | None) -> bool:
    """Whether ``exc`` (or what caused it) says the store did not answer at all: its client has retried
    already, so another attempt would only delay the caller's error."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if type(exc).__name__ in _UNREACHABLE_ERRORS or (isinstance(exc, OSError) and exc.errno in _UNREACHABLE_ERRNOS):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def fs_and_path(location: str):
    fs, path = fsspec.core.url_to_fs(str(location))
    return fs, path.rstrip("/") or "/"


def is_object_store(fs) -> bool:
    protocols = fs.protocol if isinstance(fs.protocol, (tuple, list)) else (fs.protocol,)
    return any(p in OBJECT_STORE_PROTOCOLS for p in protocols)


def atomic_write(location: str, data: bytes) -> str:
    """Write ``data`` to ``location`` so that readers see the old file or the new one; return the full URL."""
    return atomic_write_stream(location, [data])


def atomic_write_stream(location: str, chunks: Iterable[bytes]) -> str:
    """Write the concatenation of ``chunks`` to ``location`` atomically, holding one chunk at a time."""
    with atomic_open(location) as f:
        for chunk in chunks:
            f.write(chunk)
    return f.location


TMP_PREFIX = ".tmp-"


def tmp_name(name: str, tag: str = "") -> str:
    """The temporary sibling a write goes to before its rename. ``tag`` (e.g. a run's id) lets
    whoever owns those writes find the ones a crash left behind (``remove_partial_writes``)."""
    return f"{TMP_PREFIX}{tag + '-' if tag else ''}{uuid.uuid4().hex}-{name}"


class _AtomicFile(io.RawIOBase):
    """What ``atomic_open`` yields: write-only, written through in slices of at most one upload
    part, so a writer handing over a 1 GiB buffer at once (``torch.save`` hands over each
    tensor's storage) never makes the upload buffer copy all of it."""

    def __init__(self, raw, location: str):
        super().__init__()
        self._raw = raw
        self.location = location
        self.bytes_written = 0

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:
        view = memoryview(data).cast("B")
        for start in range(0, len(view), UPLOAD_BLOCK_BYTES):
            self._raw.write(view[start:start + UPLOAD_BLOCK_BYTES])
        self.bytes_written += len(view)
        return len(view)

    def tell(self) -> int:
        return self.bytes_written

    def flush(self) -> None:
        pass  # the underlying file flushes when it completes; an early flush would only cut small parts


@contextlib.contextmanager
def atomic_open(location: str, tmp_tag: str = "") -> Iterator[_AtomicFile]:
    """``with atomic_open(url) as f: f.write(...)``: the file appears at ``url`` whole when the
    block ends without an exception, and nothing appears (nothing is left half-written) when it
    raises. Data is streamed: only one upload part is held in memory. ``f.location`` is the
    full URL. ``tmp_tag``: see ``tmp_name``."""
    fs, path = fs_and_path(location)
    parent, name = path.rsplit("/", 1) if "/" in path else ("", path)
    if is_object_store(fs):
        raw = fs.open(path, "wb", block_size=UPLOAD_BLOCK_BYTES)
        try:
            yield _AtomicFile(raw, fs.unstrip_protocol(path))
        except BaseException:
            raw.discard()  # aborts the multipart upload: the key is never created half-written
            # discard() leaves the file object open, and closing it (also from __del__) would
            # try to complete the upload it just aborted.
            raw.closed = True
            raise
        raw.close()  # completes the upload: the key appears whole
        return
    if parent:
        fs.makedirs(parent, exist_ok=True)
    tmp = f"{parent}/{tmp_name(name, tmp_tag)}"
    try:
        local = isinstance(fs, LocalFileSystem)
        with (open(tmp, "wb") if local else fs.open(tmp, "wb")) as raw:
            yield _AtomicFile(raw, fs.unstrip_protocol(path))
        if local:
            os.replace(tmp, path)  # atomic on a POSIX file system
        else:
            fs.mv(tmp, path)
    except BaseException:
        try:
            fs.rm(tmp)
        except (FileNotFoundError, OSError):
            pass
        raise


def remove_partial_writes(directory: str, tag: str) -> list[str]:
    """Remove the temporary files that writes tagged ``tag`` left under ``directory`` (a process
    killed mid-write cannot clean up after itself). Returns what was removed. Object stores
    have none: an interrupted upload never becomes a key."""
    fs, base = fs_and_path(directory)
    prefix = f"{TMP_PREFIX}{tag}-"
    try:
        names = fs.ls(base, detail=False)
    except (FileNotFoundError, NotADirectoryError):
        return []
    removed = []
    for path in names:
        if path.rstrip("/").rsplit("/", 1)[-1].startswith(prefix):
            try:
                fs.rm(path)
                removed.append(path)
            except FileNotFoundError:
                pass
    return removed
