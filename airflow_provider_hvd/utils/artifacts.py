"""Finding a run's artifacts (timeline, newest checkpoint) in object storage; shared by sensor and trigger."""

from __future__ import annotations

import datetime
from typing import Any

from airflow.sdk import ObjectStoragePath

from airflow_provider_hvd.runner.checkpoint import checkpoint_step


def parse_when(value: str | datetime.datetime | None) -> datetime.datetime | None:
    if value is None or value == "":
        return None
    when = value if isinstance(value, datetime.datetime) else datetime.datetime.fromisoformat(str(value))
    return when if when.tzinfo else when.replace(tzinfo=datetime.timezone.utc)


def modified_at(path: ObjectStoragePath) -> datetime.datetime | None:
    info = path.fs.info(path.path)
    for key in ("mtime", "LastModified", "last_modified", "updated", "created"):
        value = info.get(key)
        if value is None:
            continue
        if isinstance(value, datetime.datetime):
            return value if value.tzinfo else value.replace(tzinfo=datetime.timezone.utc)
        if isinstance(value, (int, float)):
            return datetime.datetime.fromtimestamp(value, tz=datetime.timezone.utc)
        return parse_when(value)
    return None


def _fresh(path: ObjectStoragePath, newer_than: datetime.datetime | None) -> bool:
    if newer_than is None:
        return True
    when = modified_at(path)
    return when is not None and when > newer_than


def newest_checkpoint(directory: ObjectStoragePath, newer_than: datetime.datetime | None) -> str | None:
    """The highest-step complete checkpoint (``ckpt-<step>.pt``) under ``directory``, if fresh enough."""
    if not directory.exists():
        return None
    best: tuple[int, ObjectStoragePath] | None = None
    for child in directory.iterdir():
        try:
            step = checkpoint_step(child.name)
        except ValueError:
            continue  # .tmp-* files of a write in progress, and anything else
        if best is None or step > best[0]:
            best = (step, child)
    if best is None or not _fresh(best[1], newer_than):
        return None
    return str(best[1])


def find_artifacts(timeline_path: str | None, checkpoint_dir: str | None,
                   newer_than: datetime.datetime | None) -> dict[str, Any] | None:
    """Every artifact asked for, or None while any is missing."""
    found: dict[str, Any] = {}
    if timeline_path:
        timeline = ObjectStoragePath(timeline_path)
        if not (timeline.exists() and _fresh(timeline, newer_than)):
            return None
        found["timeline"] = str(timeline)
    if checkpoint_dir:
        checkpoint = newest_checkpoint(ObjectStoragePath(checkpoint_dir), newer_than)
        if checkpoint is None:
            return None
        found["checkpoint"] = checkpoint
    return found
