"""Atomic writes to a local path or any fsspec URL: readers never see half a file."""

from __future__ import annotations

import os
import uuid

import fsspec
from fsspec.implementations.local import LocalFileSystem


def fs_and_path(location: str):
    fs, path = fsspec.core.url_to_fs(str(location))
    return fs, path.rstrip("/") or "/"


def atomic_write(location: str, data: bytes) -> str:
    """Write ``data`` to ``location`` through a temporary sibling and a rename; return the full URL."""
    fs, path = fs_and_path(location)
    parent, name = path.rsplit("/", 1) if "/" in path else ("", path)
    if parent:
        fs.makedirs(parent, exist_ok=True)
    tmp = f"{parent}/.tmp-{uuid.uuid4().hex}-{name}"
    with fs.open(tmp, "wb") as f:
        f.write(data)
    try:
        if isinstance(fs, LocalFileSystem):
            os.replace(tmp, path)  # atomic on a POSIX file system
        else:
            fs.mv(tmp, path)  # object stores: the final key appears whole, by a server-side copy
    except BaseException:
        fs.rm(tmp)
        raise
    return fs.unstrip_protocol(path)
