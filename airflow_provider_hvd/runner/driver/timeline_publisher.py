"""The Horovod Timeline, delivered where the user asked, during the run and after it (driver side).

Horovod's rank 0 writes a Chrome-trace JSON array to a local file (``HOROVOD_TIMELINE``),
rewriting its last byte as each event is appended. The rank's launcher tails that
file and sends the bytes that can no longer change to the driver every few seconds; the driver
appends them to a staging file and publishes a *valid* snapshot (the array closed)
to the destination, a local path or any fsspec URL, atomically. So a person or a
sensor can open the timeline in chrome://tracing or Perfetto mid-run, and it is
delivered when training fails too. The destination is seen from the driver.
"""

from __future__ import annotations

import logging
import os
import tempfile
import threading

from airflow_provider_hvd.runner.common.storage import atomic_write

log = logging.getLogger("airflow_provider_hvd.runner")


def chrome_trace_snapshot(raw: bytes) -> bytes:
    """Close Horovod's open JSON array: drop a trailing comma and append ``]``."""
    text = raw.rstrip()
    if not text:
        return b"[]\n"
    if text.endswith(b"]"):
        return text + b"\n"
    if text.endswith(b","):
        text = text[:-1]
    return text + b"\n]\n"


class TimelinePublisher:
    """Driver side: stage the chunks and publish a valid snapshot on each (the launcher
    sends at most one chunk per interval, so that is the publishing rate too)."""

    def __init__(self, destination: str):
        self.destination = str(destination)
        fd, self._staging = tempfile.mkstemp(prefix="hvd-timeline-", suffix=".json")
        os.close(fd)
        self._lock = threading.Lock()
        self._dirty = False
        self.published = 0

    def add(self, chunk: bytes) -> None:
        with self._lock:
            with open(self._staging, "ab") as f:
                f.write(chunk)
            self._dirty = True
            self._publish()

    def _publish(self) -> None:
        with open(self._staging, "rb") as f:
            snapshot = chrome_trace_snapshot(f.read())
        try:
            atomic_write(self.destination, snapshot)
            self.published += 1
        except Exception as exc:  # a storage hiccup must not fail training; the next publish retries
            log.warning("HorovodRunner: could not write the timeline to %s: %s", self.destination, exc)
            return
        self._dirty = False

    def finish(self) -> None:
        """Publish what arrived (also after a failed run) and remove the staging file."""
        with self._lock:
            if self._dirty or self.published == 0:
                self._publish()
            try:
                os.unlink(self._staging)
            except FileNotFoundError:
                pass
        log.info("HorovodRunner: timeline written to %s", self.destination)
