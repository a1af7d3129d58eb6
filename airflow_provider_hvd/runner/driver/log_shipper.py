"""The Spark driver's output shipped to storage, for a driver that runs where no one reads its stdout.

In cluster deploy mode the driver runs on a cluster host: its stdout lands in that host's work
directory, and spark-submit, which returned once the driver was placed, prints none of it. So the
driver's Python output (its own progress and every rank line it relays) is tee'd: written to the
stream as before and, every ``interval`` seconds, appended to storage as the next numbered chunk
``<dir>/00000000.log``, ``00000001.log``, ... Each chunk is written whole (atomic_write), so a
reader that finds chunk n can read it, and one that does not has read everything there is.
``<dir>/heartbeat.json`` ({"time": ..., "chunks": n}) is rewritten at least every ``heartbeat``
seconds while the driver lives: how a follower tells a driver that is quiet from one that is gone.
Its last version, written once the application's result (or error) is in storage and its output is
all shipped, adds ``"exit_code"``: the driver's own word that it has ended, which a follower reads a
poll or two before the master reports the driver's end (its JVM has yet to exit, and its worker to
tell the master). The format is wire/driver_log.py's; the reader is the Airflow side's
hooks/standalone_driver.py.
"""

from __future__ import annotations

import io
import sys
import threading
import time
from typing import TextIO

from airflow_provider_hvd.runner.common.storage import atomic_write
from airflow_provider_hvd.runner.wire.driver_log import Heartbeat, chunk_url, heartbeat_url


class _Tee(io.TextIOBase):
    """A text stream that writes through to ``stream`` and hands a copy of the text to ``sink``."""

    def __init__(self, stream: TextIO, sink) -> None:
        self._stream = stream
        self._sink = sink

    def write(self, text: str) -> int:
        self._stream.write(text)
        self._sink(text)
        return len(text)

    def flush(self) -> None:
        self._stream.flush()

    def fileno(self) -> int:
        return self._stream.fileno()

    def isatty(self) -> bool:
        return False

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return getattr(self._stream, "encoding", "utf-8")


class LogShipper:
    """Tee this process's ``sys.stdout`` and ``sys.stderr`` into numbered chunks under ``log_dir``."""

    def __init__(self, log_dir: str, interval: float = 2.0, heartbeat: float = 10.0) -> None:
        self.log_dir = log_dir.rstrip("/")
        self.interval = interval
        self.heartbeat = heartbeat
        self._pending: list[str] = []
        self._lock = threading.Lock()
        self._ship_lock = threading.Lock()  # one writer of chunk numbers at a time
        self._seq = 0
        self._last_beat = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._saved: tuple[TextIO, TextIO] | None = None
        self.failures = 0

    def start(self) -> "LogShipper":
        self._saved = (sys.stdout, sys.stderr)
        sys.stdout = _Tee(sys.stdout, self._add)  # type: ignore[assignment]
        sys.stderr = _Tee(sys.stderr, self._add)  # type: ignore[assignment]
        self._thread = threading.Thread(target=self._run, name="hvd-log-shipper", daemon=True)
        self._thread.start()
        return self

    def _add(self, text: str) -> None:
        with self._lock:
            self._pending.append(text)

    def _run(self) -> None:
        # The first heartbeat at once, so a follower knows the driver started; from this thread, not
        # start()'s caller: its first write (the storage client's set-up, then a request) would
        # otherwise delay the SparkContext, and with it the executors' launch.
        self.ship()
        while not self._stop.wait(self.interval):
            self.ship()

    def ship(self, exit_code: int | None = None) -> None:
        """Write what was printed since the last call as the next chunk; beat when it is time (and at
        once, saying so, with the application's ``exit_code`` once it has one)."""
        with self._ship_lock:
            with self._lock:
                text, self._pending = "".join(self._pending), []
            try:
                if text:
                    atomic_write(chunk_url(self.log_dir, self._seq), text.encode("utf-8", "replace"))
                    self._seq += 1
                now = time.time()
                if text or now - self._last_beat >= self.heartbeat or exit_code is not None:
                    beat = Heartbeat(time=now, chunks=self._seq, exit_code=exit_code)
                    atomic_write(heartbeat_url(self.log_dir), beat.to_json())
                    self._last_beat = now
            except Exception as exc:  # storage hiccup: keep the text for the next try, say so on the host
                self.failures += 1
                with self._lock:
                    self._pending.insert(0, text)
                if self._saved is not None:
                    print(f"could not ship the driver's log to {self.log_dir}: {exc}", file=self._saved[1], flush=True)

    def close(self, exit_code: int | None = None) -> None:
        """Ship the rest and give the streams back; ``exit_code``: the application has ended with it
        (its result or error already written), which the last heartbeat says."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(30)
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
        if self._saved is not None:
            sys.stdout, sys.stderr = self._saved
        self.ship(exit_code)
