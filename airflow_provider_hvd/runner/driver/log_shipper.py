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
tell the master).

LogTail is the reader (the operator, while it follows the driver).
"""

from __future__ import annotations

import io
import json
import logging
import sys
import threading
import time
from typing import TextIO

from airflow_provider_hvd.runner.common.storage import atomic_write, fs_and_path

HEARTBEAT_NAME = "heartbeat.json"
log = logging.getLogger(__name__)


def chunk_url(log_dir: str, seq: int) -> str:
    return f"{log_dir.rstrip('/')}/{seq:08d}.log"


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
        # otherwise delay the SparkContext, and with it the executors' launch, by 0.2-0.4 s.
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
                    beat: dict = {"time": now, "chunks": self._seq}
                    if exit_code is not None:
                        beat["exit_code"] = exit_code
                    atomic_write(f"{self.log_dir}/{HEARTBEAT_NAME}", json.dumps(beat).encode())
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


class LogTail:
    """Reads the chunks a LogShipper wrote, in order, each once; lines come whole."""

    # Seconds between the tries of a last read that storage refused (the driver has ended: no later look).
    FINAL_READ_RETRIES = (1, 2, 4)

    def __init__(self, log_dir: str) -> None:
        self.log_dir = log_dir.rstrip("/")
        self.next_seq = 0
        self._partial = ""
        # The storage error that stopped the last read before the chunks it looked for (None: it read them all).
        self.read_error: OSError | None = None

    def read_new(self, final: bool = False, upto: int | None = None) -> list[str]:
        """The complete lines of every chunk written since the last call; ``final``: the last
        unterminated line too (the driver has ended, nothing more will come). ``upto``: the chunks
        known to exist (a heartbeat's count) are read, and no request is spent looking for another.
        A chunk that storage fails to return (an OSError other than not-found) ends this read: the lines
        before it are returned, ``read_error`` says why, and the next read starts at that chunk."""
        fs, _ = fs_and_path(self.log_dir)
        text = []
        self.read_error = None
        while upto is None or self.next_seq < upto:
            _, path = fs_and_path(chunk_url(self.log_dir, self.next_seq))
            fs.invalidate_cache(path)  # a listing cached earlier must not hide a chunk written since
            try:
                with fs.open(path, "rb") as f:
                    text.append(f.read().decode("utf-8", "replace"))
            except FileNotFoundError:
                break
            except OSError as exc:  # storage failed for a moment: nothing read is lost, the rest comes next time
                self.read_error = exc
                log.warning("Could not read the driver's output chunk %s (will read it again): %s", path, exc)
                break
            self.next_seq += 1
        joined = self._partial + "".join(text)
        lines = joined.split("\n")
        self._partial = lines.pop()
        if final and self._partial and self.read_error is None:
            lines.append(self._partial)
            self._partial = ""
        return lines

    def read_last(self) -> list[str]:
        """The driver has ended: every line it left, trying again (FINAL_READ_RETRIES) where storage fails,
        since no later look will come. Lines storage never returned are reported in the log."""
        lines = self.read_new(final=True)
        for wait in self.FINAL_READ_RETRIES:
            if self.read_error is None:
                return lines
            time.sleep(wait)
            lines += self.read_new(final=True)
        if self.read_error is not None:
            log.error("The driver's output from chunk %d on under %s could not be read (%s): it is still there for "
                      "a person to read", self.next_seq, self.log_dir, self.read_error)
            if self._partial:
                lines.append(self._partial)
                self._partial = ""
        return lines

    def heartbeat(self) -> dict | None:
        """The driver's last heartbeat ({"time": epoch seconds, "chunks": n}, plus "exit_code" once its
        application has ended), or None before its first."""
        fs, path = fs_and_path(f"{self.log_dir}/{HEARTBEAT_NAME}")
        fs.invalidate_cache(path)
        try:
            # One GET. A file object (fs.open) first looks the object up, then reads that version
            # only: S3 answers HTTP 412 when the driver rewrote the heartbeat in between.
            return json.loads(fs.cat_file(path))
        except (FileNotFoundError, ValueError):
            return None

    def look(self, ended: bool) -> tuple[list[str], bool]:
        """One look at a followed driver that the master reports ``ended`` (or not): its new lines, and
        whether its application has said it succeeded (exit code 0 in the last heartbeat: its result is
        in storage and these lines are its last, though its JVM may still be exiting). Only success
        counts: a failed driver's end is the master's to report (one that Spark relaunches writes here
        again). A look costs a read of the heartbeat and one per new chunk."""
        try:
            beat = self.heartbeat()
        except OSError as exc:  # storage unreachable for a moment: no news this look, the next one asks again
            if not ended:
                log.warning("Could not read the driver's heartbeat under %s (will look again): %s", self.log_dir, exc)
                return [], False
            beat = None
        finished = beat is not None and beat.get("exit_code") == 0
        if ended or finished:
            return self.read_last(), finished
        return self.read_new(upto=int(beat.get("chunks", 0)) if beat else 0), False
