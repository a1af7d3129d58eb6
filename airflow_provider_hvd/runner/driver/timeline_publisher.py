"""The Horovod Timeline, delivered where the user asked, during the run and after it (driver side).

Horovod's rank 0 writes a Chrome-trace JSON array to a local file (``HOROVOD_TIMELINE``).
Its launcher tails that file (barrier/timeline_tail.py) and sends the bytes that can no
longer change to the driver, in bounded chunks, every ``timeline_interval`` seconds. Here
each chunk is appended to a staging file on the driver's disk and feeds two outputs:

* the **live view**, ``<name>.live.json`` next to the destination: a valid Chrome trace
  of the most recent ``live_bytes`` of events, with the metadata events that name every
  tensor's row, rewritten at most once per interval and only when events arrived. Its
  size, so the cost of each publish, does not grow with the run. Removed once the
  complete file is written.
* the **complete timeline** at the destination, written once when training ends (also
  when it fails): the staging file streamed to storage in blocks and closed as a JSON
  array, byte for byte what Horovod itself wrote when it shut down cleanly. An object
  store gets one upload, never a rewrite of what it already holds.

The driver holds at most the live window, the metadata events (one pair per tensor name,
capped) and one chunk in memory, whatever the size of the timeline; the staging file on
the driver's disk grows with it (``TMPDIR`` decides where). The destination is seen from
the driver.
"""

from __future__ import annotations

import collections
import logging
import os
import tempfile
import threading
import time
from collections.abc import Iterator

from airflow_provider_hvd.runner.common.storage import atomic_write_stream, fs_and_path, store_unreachable
from airflow_provider_hvd.runner.driver.chrome_trace import closed_body, event_boundary_after, live_view_parts

log = logging.getLogger("airflow_provider_hvd.runner")

LIVE_SUFFIX = ".live.json"
# Horovod registers each tensor name as a "process" with two metadata events (~150 bytes);
# a model has a few hundred to a few thousand tensors. Past this cap new names are left
# out of the live view (their rows show as numbers); the complete file has them all.
METADATA_MAX_BYTES = 1 << 20
_STREAM_BLOCK = 8 << 20
_FINAL_WRITE_ATTEMPTS = 3


def live_view_location(destination: str) -> str:
    """``.../timeline.json`` -> ``.../timeline.live.json`` (any other name gets the suffix appended)."""
    destination = str(destination)
    stem = destination[:-len(".json")] if destination.endswith(".json") else destination
    return stem + LIVE_SUFFIX


def attempt_location(destination: str, attempt: int) -> str:
    """Where the complete timeline of a failed attempt that was restarted goes (``max_restarts``):
    ``.../timeline.json`` -> ``.../timeline.attempt-1.json``; the run's last attempt writes
    ``destination`` itself."""
    destination = str(destination)
    stem = destination[:-len(".json")] if destination.endswith(".json") else destination
    return f"{stem}.attempt-{attempt}.json"


class TimelinePublisher:
    """Driver side: stage every chunk, publish a bounded live view each interval, the whole file at the end.

    :param destination: the complete timeline's path or fsspec URL.
    :param interval: seconds between live-view publishes.
    :param live_bytes: size of the live view's window of recent events; 0: no live view,
        only the complete file at the end.
    """

    def __init__(self, destination: str, interval: float, live_bytes: int):
        self.destination = str(destination)
        self.live_destination = live_view_location(self.destination) if live_bytes else None
        self.interval = float(interval)
        self.live_bytes = int(live_bytes)
        fd, self._staging_path = tempfile.mkstemp(prefix="hvd-timeline-", suffix=".json")
        self._staging = os.fdopen(fd, "wb")
        self._lock = threading.Lock()
        self._window: collections.deque[bytes] = collections.deque()
        self._window_size = 0
        self._metadata: dict[bytes, bytes] = {}
        self._metadata_size = 0
        self._metadata_full_logged = False
        self._dirty = False
        # What was written, for the logs, the tests and bench/: counts and sizes, not a history.
        self.staged_bytes = 0
        self.live_publishes = 0
        self.live_publishing = False  # a live view is being written now
        self.live_bytes_max = 0
        self.live_bytes_total = 0
        self.final_bytes = 0
        self._stopped = threading.Event()
        self._thread = None
        if self.live_destination:
            self._thread = threading.Thread(target=self._publish_live_loop, name="hvd-timeline-live", daemon=True)
            self._thread.start()
            log.info("HorovodRunner: timeline: live view (the last %.1f MiB of events) at %s every %g s; the "
                     "complete timeline goes to %s when training ends", self.live_bytes / 2**20,
                     self.live_destination, self.interval, self.destination)
        else:
            log.info("HorovodRunner: timeline: the complete timeline goes to %s when training ends (no live view)",
                     self.destination)

    # -- chunks from rank 0's launcher (a service thread) -------------------------------------------------------

    def add(self, chunk: bytes) -> None:
        with self._lock:
            first = self.staged_bytes == 0
            self._staging.write(chunk)
            self.staged_bytes += len(chunk)
            if not self.live_destination:
                return
            self._keep_metadata(chunk)
            if first:  # Horovod's opening "[": the live view writes its own
                chunk = chunk.lstrip()[1:] if chunk.lstrip().startswith(b"[") else chunk
            self._window.append(chunk)
            self._window_size += len(chunk)
            self._trim_window()
            self._dirty = True

    def _keep_metadata(self, chunk: bytes) -> None:
        """Keep Horovod's metadata events (tensor names, sort order, start time): a window that
        starts mid-run would otherwise show bare numbers instead of tensor names."""
        at = chunk.find(b'"ph": "M"')
        while at >= 0:
            start = chunk.rfind(b"{", 0, at)
            end = chunk.find(b"},", at)
            end = end + 1 if end >= 0 else len(chunk)
            # bytes(): the channel hands chunks over as bytearrays, which cannot be keys.
            event = bytes(chunk[start:end].rstrip().rstrip(b"]").rstrip())
            key = event.split(b'"args"', 1)[0]
            if key not in self._metadata:
                if self._metadata_size + len(event) <= METADATA_MAX_BYTES:
                    self._metadata[key] = event
                    self._metadata_size += len(event)
                elif not self._metadata_full_logged:
                    self._metadata_full_logged = True
                    log.warning("HorovodRunner: timeline: more tensor names than the live view keeps (%d KiB of "
                                "metadata); later ones show as numbers there, the complete file has them all",
                                METADATA_MAX_BYTES >> 10)
            at = chunk.find(b'"ph": "M"', end)

    def _trim_window(self) -> None:
        while self._window_size > self.live_bytes:
            oldest = self._window.popleft()
            self._window_size -= len(oldest)
            excess = self._window_size + len(oldest) - self.live_bytes
            if excess < len(oldest):  # keep the part of the oldest chunk that fits, from an event boundary
                kept = oldest[event_boundary_after(oldest, excess):]
                if kept:
                    self._window.appendleft(kept)
                    self._window_size += len(kept)
                return

    # -- publishing ----------------------------------------------------------------------------------------------

    def _publish_live_loop(self) -> None:
        while not self._stopped.wait(self.interval):
            self._publish_live()

    def _publish_live(self) -> None:
        with self._lock:
            if not self._dirty:
                return
            self._dirty = False
            self.live_publishing = True
            # The deque only ever drops its references to old chunks, so these stay as they are while written.
            chunks, metadata = list(self._window), list(self._metadata.values())
        parts = live_view_parts(chunks, metadata)
        size = sum(len(p) for p in parts)
        try:
            atomic_write_stream(self.live_destination, parts)
        except Exception as exc:  # a storage hiccup must not fail training; the next interval retries
            log.warning("HorovodRunner: could not write the timeline's live view to %s: %s",
                        self.live_destination, exc)
            with self._lock:
                self._dirty = True
                self.live_publishing = False
            return
        self.live_publishes += 1
        self.live_publishing = False
        self.live_bytes_max = max(self.live_bytes_max, size)
        self.live_bytes_total += size

    def _complete_timeline(self) -> Iterator[bytes]:
        """The staging file closed as a JSON array, in blocks: never more than one block in memory."""
        size = os.path.getsize(self._staging_path)
        with open(self._staging_path, "rb") as f:
            tail_start = max(0, size - 65536)
            f.seek(tail_start)
            body, closing = closed_body(f.read())
            body += tail_start
            self.final_bytes = body + len(closing)
            f.seek(0)
            left = body
            while left > 0:
                block = f.read(min(_STREAM_BLOCK, left))
                if not block:
                    break
                left -= len(block)
                yield block
        yield closing

    def _keep_on_driver(self, exc: Exception, tried: str) -> None:
        """Nothing is lost: the staging file is the complete timeline (Horovod's file as rank 0 left
        it), kept on the driver's disk for the user to copy."""
        kept = self._staging_path
        self._staging_path = None
        log.error("HorovodRunner: could not write the timeline to %s %s: %s. The complete timeline stays on "
                  "the driver at %s", self.destination, tried, exc, kept)
        if self.live_destination and self.live_publishes:
            log.error("HorovodRunner: the timeline's live view stays at %s", self.live_destination)

    def finish(self, destination: str | None = None) -> None:
        """Write the complete timeline (also after a failed run), then remove the live view and the staging file.
        ``destination``: somewhere else than the one given at the start (a restarted attempt's)."""
        if destination is not None:
            self.destination = str(destination)
        self._stopped.set()
        if self._thread is not None:
            self._thread.join()  # a live publish in progress ends before the live view is removed
        t0 = time.monotonic()
        with self._lock:
            self._staging.close()
            try:
                for attempt in range(1, _FINAL_WRITE_ATTEMPTS + 1):
                    try:
                        atomic_write_stream(self.destination, self._complete_timeline())
                        break
                    except Exception as exc:
                        unreachable = store_unreachable(exc)
                        if attempt == _FINAL_WRITE_ATTEMPTS or unreachable:
                            self._keep_on_driver(exc, "(the store did not answer)" if unreachable
                                                 else f"after {attempt} attempts")
                            return
                        log.warning("HorovodRunner: writing the timeline to %s failed (%s); retrying",
                                    self.destination, exc)
                        time.sleep(attempt)
                log.info("HorovodRunner: timeline written to %s (%.1f MiB in %.1f s)", self.destination,
                         self.final_bytes / 2**20, time.monotonic() - t0)
                if self.live_destination and self.live_publishes:
                    fs, path = fs_and_path(self.live_destination)
                    try:
                        fs.rm(path)
                    except FileNotFoundError:
                        pass
                    except Exception as exc:
                        log.warning("HorovodRunner: could not remove the timeline's live view %s: %s",
                                    self.live_destination, exc)
            finally:
                if self._staging_path is not None:
                    try:
                        os.unlink(self._staging_path)
                    except FileNotFoundError:
                        pass
