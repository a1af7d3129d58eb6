"""Who is where: every barrier task tells the driver its host, the driver answers with the whole list.

This replaces ``BarrierTaskContext.allGather`` (and, under mpi, the final
``barrier()``): Spark's barrier calls poll in whole seconds on the task side, so
each one costs up to a second even when every task has already arrived
(docs/benchmarks.md). The driver service already accepts an
authenticated channel from every task, so the exchange costs one round trip.

The task's side is barrier/roster_member.py. The task keeps its roster channel while
it has something to serve (the mpi launcher's rsh service); the driver's STOP, or
the channel closing, releases it. A task whose channel drops before it said BYE
died with its executor, and the driver reports the ranks of that task as lost.
"""

from __future__ import annotations

import threading

from airflow_provider_hvd.runner.common.rank_slots import Slot, assign_slots
from airflow_provider_hvd.runner.wire.channel import Channel
from airflow_provider_hvd.runner.wire.messages import Roster as RosterMessage, TaskInfo


class Roster:
    """The driver's side: collects ``size`` task infos, then sends each task the list in partition order."""

    def __init__(self, size: int):
        self.size = size
        self._lock = threading.Lock()
        self._members: dict[int, tuple[Channel, TaskInfo]] = {}
        self._slots: list[Slot] | None = None

    def join(self, channel: Channel, partition: int, info: TaskInfo) -> list[Slot] | None:
        """Record a task; when it completes the roster, answer every task and return the slots."""
        if not 0 <= partition < self.size:
            raise ValueError(f"roster: bad join from {channel.peer}: partition {partition!r}, info {info!r}")
        with self._lock:
            self._members[partition] = (channel, info)
            if len(self._members) < self.size:
                return None
            infos = [self._members[p][1] for p in range(self.size)]
            self._slots = assign_slots([i.host for i in infos])
            for member, _ in self._members.values():
                try:
                    member.send_message(RosterMessage(tasks=infos))
                except OSError:
                    pass  # that task is gone; its handler reports it
            return self._slots

    def ranks_of(self, partition: int) -> list[int]:
        """The ranks a task's executor held (empty before the roster completed)."""
        with self._lock:
            return [self._slots[partition].rank] if self._slots else []
