"""HorovodArtifactTrigger: the deferrable half of HorovodArtifactSensor (shape of the standard FileTrigger),
and the look for a run's artifacts (timeline, newest checkpoint) that both take."""

from __future__ import annotations

import asyncio
import datetime
from collections.abc import AsyncIterator
from typing import Any

from airflow.sdk import ObjectStoragePath
from airflow.triggers.base import BaseTrigger, TaskSuccessEvent, TriggerEvent

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




class HorovodArtifactTrigger(BaseTrigger):
    """Fires once the Horovod timeline and/or a rank-0 checkpoint exist (and are newer than ``newer_than``).

    :param timeline_path: timeline file to wait for (any ObjectStoragePath URL), or None.
    :param checkpoint_dir: folder of ``ckpt-<step>.pt`` files to wait for, or None.
    :param newer_than: ISO timestamp; only artifacts modified after it count.
    :param poke_interval: seconds between looks.
    :param end_from_trigger: end the task here, in the triggerer, with what was found as its
        ``return_value`` XCom, instead of resuming it on a worker (as the standard provider's
        ``DateTimeTrigger(end_from_trigger=True)``).
    """

    def __init__(self, timeline_path: str | None = None, checkpoint_dir: str | None = None,
                 newer_than: str | None = None, poke_interval: float = 5.0, end_from_trigger: bool = False,
                 **kwargs: Any):
        super().__init__()
        self.timeline_path = timeline_path
        self.checkpoint_dir = checkpoint_dir
        self.newer_than = newer_than
        self.poke_interval = poke_interval
        self.end_from_trigger = end_from_trigger

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            "airflow_provider_hvd.triggers.horovod_artifact.HorovodArtifactTrigger",
            {"timeline_path": self.timeline_path, "checkpoint_dir": self.checkpoint_dir,
             "newer_than": self.newer_than, "poke_interval": self.poke_interval,
             "end_from_trigger": self.end_from_trigger},
        )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        newer_than = parse_when(self.newer_than)
        while True:
            # Storage calls block: keep them off the triggerer's event loop.
            found = await asyncio.to_thread(find_artifacts, self.timeline_path, self.checkpoint_dir, newer_than)
            if found is not None:
                if self.end_from_trigger:
                    self.log.info("Horovod artifacts found: %s; the task ends here, in the triggerer", found)
                    yield TaskSuccessEvent(xcoms={"return_value": found})
                else:
                    self.log.info("Horovod artifacts found: %s", found)
                    yield TriggerEvent({"status": "success", "found": found})
                return
            await asyncio.sleep(self.poke_interval)
