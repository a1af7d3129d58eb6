"""Who is where: every barrier task tells the driver its host, the driver answers with the whole list.

This replaces ``BarrierTaskContext.allGather`` (and, under mpi, the final
``barrier()``): Spark's barrier calls poll in whole seconds on the task side, so
each one cost about 1 s even when every task had already arrived (measured in
bench/, see docs/benchmarks.md). The driver service already accepts an
authenticated channel from every task, so the exchange costs one round trip.

The task keeps its roster channel while it has something to serve (the mpi
launcher's rsh service); the driver's "stop", or the channel closing, releases
it. A task whose channel drops before it said "bye" died with its executor, and
the driver reports the ranks of that task as lost.
"""

from __future__ import annotations

import threading
from typing import Any

from airflow_provider_hvd.runner import channel as channel_mod
from airflow_provider_hvd.runner.channel import Channel
from airflow_provider_hvd.runner.topology import Slot, assign_slots


class Roster:
    """The driver's side: collects ``size`` task infos, then sends each task the list in partition order."""

    def __init__(self, size: int):
        self.size = size
        self._lock = threading.Lock()
        self._members: dict[int, tuple[Channel, dict[str, Any]]] = {}
        self._slots: list[Slot] | None = None

    def join(self, channel: Channel, partition: int, info: dict[str, Any]) -> list[Slot] | None:
        """Record a task; when it completes the roster, answer every task and return the slots."""
        if not 0 <= partition < self.size or not isinstance(info.get("host"), str):
            raise ValueError(f"roster: bad join from {channel.peer}: partition {partition!r}, info {info!r}")
        with self._lock:
            self._members[partition] = (channel, info)
            if len(self._members) < self.size:
                return None
            infos = [self._members[p][1] for p in range(self.size)]
            self._slots = assign_slots([i["host"] for i in infos])
            for member, _ in self._members.values():
                try:
                    member.send_json({"op": "roster", "tasks": infos})
                except OSError:
                    pass  # that task is gone; its handler reports it
            return self._slots

    def ranks_of(self, partition: int) -> list[int]:
        """The ranks a task's executor held (empty before the roster completed)."""
        with self._lock:
            return [self._slots[partition].rank] if self._slots else []


class RosterMember:
    """A barrier task's side."""

    def __init__(self, driver: tuple[str, int], secret: bytes, partition: int, info: dict[str, Any]):
        self._channel = channel_mod.connect(driver, secret, {"role": "task", "partition": partition,
                                                             "info": info})

    def tasks(self) -> list[dict[str, Any]]:
        """Block until every task has joined; return their infos in partition order."""
        message = self._channel.recv_json()
        if message.get("op") != "roster":
            raise ConnectionError(f"expected the roster from the driver, got {message!r:.200}")
        return message["tasks"]

    def wait_for_stop(self) -> None:
        """Block until the driver says the run is over (or is gone)."""
        try:
            while True:
                kind, message = self._channel.recv()
                if kind == "json" and message.get("op") == "stop":
                    return
        except (OSError, ValueError):
            return

    def leave(self) -> None:
        try:
            self._channel.send_json({"op": "bye"})
        except OSError:
            pass
        self._channel.close()
