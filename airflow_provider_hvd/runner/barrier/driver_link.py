"""A launcher's link to the driver: reports go up, the driver's "stop" comes down, and
rank 0's timeline is shipped in chunks. Shared by the gloo launcher (rank_process)
and the mpi launcher (mpi_run)."""

from __future__ import annotations

import threading
from typing import Callable

from airflow_provider_hvd.runner.barrier.timeline_tail import TimelineTail
from airflow_provider_hvd.runner.wire import channel as channel_mod
from airflow_provider_hvd.runner.wire.messages import Bye, Exited, Message, Op, Timeline
from airflow_provider_hvd.runner.wire.hellos import LauncherHello


class DriverLink:
    def __init__(self, driver: tuple[str, int], secret: bytes, hello: LauncherHello):
        self.channel = channel_mod.connect(driver, secret, hello)
        self._timeline_tail: TimelineTail | None = None
        self._timeline_done = threading.Event()
        self._timeline_thread: threading.Thread | None = None
        # One reader of the tail at a time: the final read must not overtake a chunk the interval
        # thread has read and not yet sent, or the driver would stage them out of order.
        self._timeline_lock = threading.Lock()

    def send(self, message: Message) -> None:
        """Best effort: once the driver is gone there is nobody left to tell."""
        try:
            self.channel.send_message(message)
        except OSError:
            pass

    def on_stop(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` when the driver says "stop" or closes the channel (the run is over)."""

        def watch() -> None:
            self.channel.read_until(Op.STOP)
            callback()

        threading.Thread(target=watch, name="hvd-driver-watch", daemon=True).start()

    def ship_timeline(self, path: str, interval: float) -> None:
        self._timeline_tail = TimelineTail(path)

        def loop() -> None:
            while not self._timeline_done.wait(interval):
                self._send_timeline(final=False)

        self._timeline_thread = threading.Thread(target=loop, name="hvd-timeline", daemon=True)
        self._timeline_thread.start()

    def _send_timeline(self, final: bool) -> None:
        """Send everything Horovod appended since the last call, one bounded chunk at a time.
        The interval thread stops between chunks once ``finish`` has begun; the final call sends the rest."""
        with self._timeline_lock:
            while (final or not self._timeline_done.is_set()) and (chunk := self._timeline_tail.read_new(final=final)):
                try:
                    self.channel.send_message(Timeline(size=len(chunk)), chunk)
                except OSError:
                    return

    def finish(self, reports: list[Exited]) -> None:
        """Ship the rest of the timeline (after a failure too), send the exit reports, say bye."""
        if self._timeline_tail is not None:
            self._timeline_done.set()
            self._timeline_thread.join(10)
            self._send_timeline(final=True)
        for report in reports:
            self.send(report)
        self.send(Bye())
        self.channel.close()
