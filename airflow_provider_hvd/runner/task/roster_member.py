"""A barrier task's side of the roster (driver/roster.py): send this task's host, get every task's.

The channel stays open while the task has something to serve (the mpi launcher's rsh
service), until the driver's STOP; leaving with BYE tells the driver this task ended on
purpose, not with its executor.
"""

from __future__ import annotations

from typing import Any

from airflow_provider_hvd.runner.wire import channel as channel_mod
from airflow_provider_hvd.runner.wire.messages import Op, Role


class RosterMember:
    """A barrier task's member of the roster."""

    def __init__(self, driver: tuple[str, int], secret: bytes, partition: int, info: dict[str, Any]):
        self._channel = channel_mod.connect(driver, secret, {"role": Role.TASK, "partition": partition,
                                                             "info": info})

    def tasks(self) -> list[dict[str, Any]]:
        """Block until every task has joined; return their infos in partition order."""
        message = self._channel.recv_json()
        if message.get("op") != Op.ROSTER:
            raise ConnectionError(f"expected the roster from the driver, got {message!r:.200}")
        return message["tasks"]

    def wait_for_stop(self) -> None:
        """Block until the driver says the run is over (or is gone)."""
        self._channel.read_until(Op.STOP)

    def leave(self) -> None:
        try:
            self._channel.send_json({"op": Op.BYE})
        except OSError:
            pass
        self._channel.close()
