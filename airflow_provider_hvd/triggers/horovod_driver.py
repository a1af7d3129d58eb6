"""HorovodDriverTrigger: follows a Spark driver that runs on the cluster while its task is deferred.

The operator submits in standalone cluster mode, then defers to this trigger:
no worker slot is held while training runs. The trigger polls the master's REST server for the
driver's state and relays the driver's shipped output (runner/driver/log_shipper.py) into the task
log as it comes; it fires once the driver has ended (the master says so, or the driver's own end
record says it succeeded, which comes first), with its final state and how far the output was
read, and the task resumes in execute_complete to read rank 0's result. A user who marks the deferred
task failed (or clears it) kills the driver through ``on_kill`` (Airflow 3.3 calls it for that alone,
never when the triggerer restarts or hands the trigger to another triggerer).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from airflow_provider_hvd.runner.driver.log_shipper import LogTail
from airflow_provider_hvd.utils.standalone_master import DRIVER_ENDED, driver_state, kill_driver, poll_delay


class HorovodDriverTrigger(BaseTrigger):
    """Fires when the Spark driver ``driver_id`` has ended.

    :param rest_endpoint: the standalone master's REST server (http://host:6066).
    :param driver_id: the driver's submission id.
    :param log_dir: where the driver ships its output (URL).
    :param next_seq: the first chunk not yet in the task log.
    :param poll_interval: seconds between looks (quicker in the first half-minute: standalone_master.poll_delay).
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

    async def run(self) -> AsyncIterator[TriggerEvent]:
        tail = LogTail(self.log_dir)
        tail.next_seq = self.next_seq  # a restarted triggerer goes on where the task log is
        last = None
        started = time.monotonic()
        while True:
            # HTTP and storage calls block: keep them off the triggerer's event loop.
            try:
                state = await asyncio.to_thread(driver_state, self.rest_endpoint, self.driver_id)
            except (OSError, ValueError) as exc:
                self.log.warning("The Spark master at %s did not answer: %s", self.rest_endpoint, exc)
                state = last
            ended = state in DRIVER_ENDED
            lines, finished = await asyncio.to_thread(tail.look, ended)
            for line in lines:
                self.log.info("%s", line)
            if finished and not ended:  # its own word, a poll or two before the master's
                state, ended = "FINISHED", True
            if state != last:
                self.log.info("Spark driver %s: %s", self.driver_id, state)
                last = state
            if ended:
                yield TriggerEvent({"driver_id": self.driver_id, "state": state, "next_seq": tail.next_seq})
                return
            await asyncio.sleep(poll_delay(time.monotonic() - started, self.poll_interval))

    async def on_kill(self) -> None:
        """The task was marked failed, cleared or marked succeeded while deferred: end the driver (and so
        every rank) as the operator's on_kill would; the Spark application must not outlive its task."""
        answer = await asyncio.to_thread(kill_driver, self.rest_endpoint, self.driver_id)
        self.log.info("Asked the Spark master to kill driver %s: %s", self.driver_id, answer)
