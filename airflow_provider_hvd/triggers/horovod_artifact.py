"""HorovodArtifactTrigger: the deferrable half of HorovodArtifactSensor (shape of the standard FileTrigger)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import BaseTrigger, TaskSuccessEvent, TriggerEvent

from airflow_provider_hvd.utils.artifacts import find_artifacts, parse_when


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
