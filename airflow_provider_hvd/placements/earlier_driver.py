"""Which Spark driver a try started on a standalone cluster, and what a later try of the same task does about it.

In standalone cluster mode the driver runs on a Spark worker, not in the task: when the Airflow
worker dies mid-training (a restart, a redeploy, an OOM kill), the driver trains on, and the
task's next try must not start a second training beside it. So each try that submits a driver
records it (``<try prefix>/spark-driver.json``), and a later try asks the master about the newest
earlier record before it submits anything:

========================  ==================================================================
the master says           the new try
========================  ==================================================================
SUBMITTED, RUNNING, ...   attaches: follows that driver and reads its result (one training)
FINISHED                  attaches too: the result is already there, nothing is trained again
FAILED, KILLED, ERROR     starts a new driver (resuming from a checkpoint when asked)
NOT_FOUND                 the master has forgotten the id (it restarted): the driver's own
                          heartbeat in storage decides. Fresh: it still runs somewhere, and the
                          try fails saying so (a second training would race it for the same
                          checkpoints). Stale or absent: it is gone; a new driver, with a warning.
========================  ==================================================================

Only the newest earlier record counts: a try that attached wrote none, so the record it
attached to stays the newest; a try that started a new driver recorded that one.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from typing import Any

from airflow_provider_hvd.hooks.standalone_driver import DRIVER_ENDED
from airflow_provider_hvd.runner.wire.driver_log import Heartbeat

# The driver's LogShipper beats every 10 s; three missed beats, plus room for the clock of the
# worker that runs it being behind or ahead of the Airflow worker's.
HEARTBEAT_STALE_AFTER = 60.0


@dataclass(frozen=True)
class DriverRecord:
    """A driver a try submitted: its submission id on the master, and where it ships its output."""

    driver_id: str
    rest_endpoint: str
    try_number: int
    log_dir: str
    submitted_at: float

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> DriverRecord:
        data: dict[str, Any] = json.loads(text)
        return cls(**{name: data[name] for name in cls.__dataclass_fields__})


@dataclass(frozen=True)
class Decision:
    attach: bool
    message: str


class DriverStillRunning(RuntimeError):
    """An earlier try's driver that the master no longer knows still beats: refuse to start another."""


def decide(record: DriverRecord, state: str, heartbeat: Heartbeat | None, now: float | None = None) -> Decision:
    """What a later try does about ``record``, given the master's ``state`` for it and the driver's
    last ``heartbeat``; raises DriverStillRunning when it can do nothing safely."""
    who = f"Spark driver {record.driver_id} of try {record.try_number}"
    if state == "FINISHED":
        return Decision(True, f"{who} FINISHED while no task followed it: taking its result, training nothing "
                              f"again")
    if state not in DRIVER_ENDED:
        return Decision(True, f"{who} is still {state}: attaching to it instead of starting a second training")
    if state != "NOT_FOUND":
        return Decision(False, f"{who} ended {state}: starting a new driver")
    age = None if heartbeat is None else (now if now is not None else time.time()) - heartbeat.time
    if age is not None and age < HEARTBEAT_STALE_AFTER:
        raise DriverStillRunning(
            f"{who} is unknown to the Spark master at {record.rest_endpoint} (restarted without recovery?), yet "
            f"its heartbeat in {record.log_dir} is {max(age, 0):.0f} s old: it still runs on some worker. Starting a "
            f"second training beside it would race it for the same checkpoints, so this try starts nothing. Kill "
            f"that driver (its process is org.apache.spark.deploy.worker.DriverWrapper on a Spark worker, with "
            f"{record.driver_id} in its work directory's path) or let it finish, then clear this task.")
    silence = "it never beat" if age is None else f"its last heartbeat is {age:.0f} s old"
    return Decision(False, f"{who} is unknown to the Spark master at {record.rest_endpoint} (restarted without "
                           f"recovery?) and {silence}: it is gone. Starting a new driver")
