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

import os
import uuid
from collections.abc import Iterable

import fsspec
from fsspec.implementations.local import LocalFileSystem

# Stores whose writes become visible only when the upload completes.
OBJECT_STORE_PROTOCOLS = frozenset({"s3", "s3a", "gs", "gcs", "az", "abfs", "abfss", "adl"})
# Upload part size for streamed writes: S3's minimum part is 5 MiB; s3fs's default (50 MiB)
# would be that much memory per open upload.
UPLOAD_BLOCK_BYTES = 8 << 20


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
    fs, path = fs_and_path(location)
    parent, name = path.rsplit("/", 1) if "/" in path else ("", path)
    if is_object_store(fs):
        f = fs.open(path, "wb", block_size=UPLOAD_BLOCK_BYTES)
        try:
            for chunk in chunks:
                f.write(chunk)
        except BaseException:
            f.discard()  # aborts the multipart upload: the key is never created half-written
            # discard() leaves the file object open, and closing it (also from __del__) would
            # try to complete the upload it just aborted.
            f.closed = True
            raise
        f.close()  # completes the upload: the key appears whole
        return fs.unstrip_protocol(path)
    if parent:
        fs.makedirs(parent, exist_ok=True)
    tmp = f"{parent}/.tmp-{uuid.uuid4().hex}-{name}"
    try:
        with fs.open(tmp, "wb") as f:
            for chunk in chunks:
                f.write(chunk)
        if isinstance(fs, LocalFileSystem):
            os.replace(tmp, path)  # atomic on a POSIX file system
        else:
            fs.mv(tmp, path)
    except BaseException:
        try:
            fs.rm(tmp)
        except (FileNotFoundError, OSError):
            pass
        raise
    return fs.unstrip_protocol(path)
