"""Checkpoint files by name: ``ckpt-<step>.pt``, and the complete ones under a folder.

Shared by the public checkpoint API (runner/checkpoint.py) and the driver's restarts
(driver/run_checkpoints.py). Temporary files (``.tmp-*``) never match the name.
"""

from __future__ import annotations

import re

from airflow_provider_hvd.runner.common.storage import fs_and_path

NAME = re.compile(r"^ckpt-(\d{10})\.pt$")


def checkpoint_name(step: int) -> str:
    return f"ckpt-{step:010d}.pt"


def list_checkpoints(directory: str) -> dict[str, tuple]:
    """Every complete checkpoint under ``directory``: ``{url: (step, version)}``, where
    ``version`` changes when the file is rewritten (size and modification time or ETag)."""
    fs, base = fs_and_path(directory)
    try:
        entries = fs.ls(base, detail=True)
    except (FileNotFoundError, NotADirectoryError):
        return {}
    found = {}
    for entry in entries:
        match = NAME.match(entry["name"].rstrip("/").rsplit("/", 1)[-1])
        if match:
            version = (entry.get("size"), entry.get("mtime") or entry.get("LastModified") or entry.get("ETag"))
            found[fs.unstrip_protocol(entry["name"])] = (int(match.group(1)), version)
    return found
