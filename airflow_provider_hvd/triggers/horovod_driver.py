"""HorovodDriverTrigger: follows a Spark driver that runs on the cluster while its task is deferred.

The standalone cluster placement submits, then defers to this trigger: no worker slot is held while
training runs. Each poll is one ``StandaloneDriverHook.look`` (the same look the operator's own
follower takes), in a thread: the driver's state from the master's REST server, its shipped output
into the task log. It fires once the driver has ended, with its final state and how far the output
was read; the task resumes in execute_complete to read rank 0's result. A user who marks the deferred
task failed (or clears it) kills the driver through ``on_kill`` (Airflow 3.3 calls it for that alone,
never when the triggerer restarts or hands the trigger to another triggerer).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import asdict, dataclass
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from airflow_provider_hvd.hooks.standalone_driver import StandaloneDriverHook, poll_delay


@dataclass(frozen=True)
class DriverEnded:
    """The trigger's one event: the driver's final state, and the first chunk of its output not yet in the
    task log."""

    driver_id: str
    state: str
    next_seq: int

    def to_event(self) -> TriggerEvent:
        return TriggerEvent(asdict(self))

    @classmethod
    def from_event(cls, payload: dict[str, Any]) -> DriverEnded:
        return cls(driver_id=str(payload["driver_id"]), state=str(payload["state"]),
                   next_seq=int(payload["next_seq"]))


class HorovodDriverTrigger(BaseTrigger):
    """Fires when the Spark driver ``driver_id`` has ended.

    :param rest_endpoint: the standalone master's REST server (http://host:6066).
    :param driver_id: the driver's submission id.
    :param log_dir: where the driver ships its output (URL).
    :param next_seq: the first chunk not yet in the task log.
    :param poll_interval: seconds between looks (quicker in the first half-minute: poll_delay).
    """

    def __init__(self, rest_endpoint: str, driver_id: str, log_dir: str, next_seq: int = 0,
                 poll_interval: float = 1.0, **kwargs: Any):
        super().__init__()
        self.rest_endpoint = rest_endpoint
        self.driver_id = driver_id
        self.log_dir = log_dir
        self.next_seq = next_seq
        self.poll_interval = poll_interval

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return ("airflow_provider_hvd.triggers.horovod_driver.HorovodDriverTrigger",
                {"rest_endpoint": self.rest_endpoint, "driver_id": self.driver_id, "log_dir": self.log_dir,
                 "next_seq": self.next_seq, "poll_interval": self.poll_interval})

    def _hook(self) -> StandaloneDriverHook:
        # A restarted triggerer goes on where the task log is.
        return StandaloneDriverHook(self.rest_endpoint, self.driver_id, self.log_dir, self.next_seq)

    async def run(self) -> AsyncIterator[TriggerEvent]:
        hook = self._hook()
        last = None
        started = time.monotonic()
        while True:
            seen = await asyncio.to_thread(hook.look)  # HTTP and storage calls block: off the event loop
            if seen.unreachable is not None:
                self.log.warning("The Spark master at %s did not answer: %s", self.rest_endpoint, seen.unreachable)
            for line in seen.lines:
                self.log.info("%s", line)
            if seen.state != last:
                self.log.info("Spark driver %s: %s", self.driver_id, seen.state)
                last = seen.state
            if seen.ended:
                yield DriverEnded(self.driver_id, str(seen.state), hook.next_seq).to_event()
                return
            await asyncio.sleep(poll_delay(time.monotonic() - started, self.poll_interval))

    async def on_kill(self) -> None:
        """The task was marked failed, cleared or marked succeeded while deferred: end the driver (and so
        every rank) as the operator's on_kill would; the Spark application must not outlive its task."""
        await asyncio.to_thread(self._hook().kill)
