"""A barrier task's side of the roster (driver/roster.py): send this task's host, get every task's.

The channel stays open while the task has something to serve or run (the mpi launcher's rsh
service, its ranks), until the driver's STOP; leaving with BYE tells the driver this task ended
on purpose, not with its executor. It carries nothing while ranks run, so TCP keepalive can tell
when the driver's host went silent (a network cut), which a channel busy sending rank output
cannot: ``watch`` stops the ranks then.
"""

from __future__ import annotations

import threading
from typing import Callable

from airflow_provider_hvd.runner.wire import channel as channel_mod
from airflow_provider_hvd.runner.wire.messages import Bye, Op, Roster, TaskInfo
from airflow_provider_hvd.runner.wire.hellos import TaskHello


class RosterMember:
    """A barrier task's member of the roster."""

    def __init__(self, driver: tuple[str, int], secret: bytes, partition: int, info: TaskInfo):
        self._channel = channel_mod.connect(driver, secret, TaskHello(partition=partition, info=info))
        self._leaving = False

    def tasks(self) -> list[TaskInfo]:
        """Block until every task has joined; return their infos in partition order."""
        message = self._channel.recv_message()
        if not isinstance(message, Roster):
            raise ConnectionError(f"expected the roster from the driver, got {message!r:.200}")
        return message.tasks

    def watch(self, on_end: Callable[[], None]) -> threading.Event:
        """From now on a thread reads this channel (nothing else may): when the driver says stop,
        or the channel ends (the driver gone, or silent), ``on_end`` runs, unless this task is
        leaving anyway. Returns an event set at that moment."""
        ended = threading.Event()

        def read() -> None:
            self._channel.read_until(Op.STOP)
            ended.set()
            if not self._leaving:
                on_end()

        threading.Thread(target=read, name="hvd-roster-watch", daemon=True).start()
        return ended

    def wait_for_stop(self) -> None:
        """Block until the driver says the run is over (or is gone)."""
        self._channel.read_until(Op.STOP)

    def leave(self) -> None:
        self._leaving = True
        try:
            self._channel.send_message(Bye())
        except OSError:
            pass
        self._channel.close()
