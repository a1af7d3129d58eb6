"""Rank 0's Horovod Timeline, read as it grows: the launcher's side of timeline delivery.

Horovod's rank 0 writes a Chrome-trace JSON array to a local file (``HOROVOD_TIMELINE``),
rewriting its last byte as each event is appended. The rank's launcher tails that file
and its DriverLink sends the bytes that can no longer change to the driver every few
seconds, in chunks of at most ``CHUNK_BYTES``, where driver/timeline_publisher.py
delivers them. Reads are bounded so a launcher that fell behind (or the final read of a
long run) never holds more than one chunk in memory.
"""

from __future__ import annotations

import re

CHUNK_BYTES = 4 << 20
# A "]" that Horovod has since overwritten with ",": see _repair_stale_closings.
_STALE_CLOSING = re.compile(rb"\}\](\s*\{)")


def _repair_stale_closings(data: bytes) -> bytes:
    """Horovod ends the file with "}]" after every event, then seeks back and overwrites that "]"
    with "," before the next event. A read that overlaps such an append (one read() spans several
    system calls, and the writer may move between them) can return the old "]" followed by the
    new event: "}]{". Nothing may follow the array's closing bracket, so that "]" is always one
    Horovod has rewritten as ",": restore it. (Found by tests/test_timeline_scale.py, whose writer
    appends hundreds of MB a second: now and then the complete file had "}]{" in it.)"""
    if b"}]" not in data:
        return data
    return _STALE_CLOSING.sub(rb"},\1", data)


class TimelineTail:
    """Reads what Horovod appended to the local timeline since the last call, whole events only."""

    def __init__(self, path: str, chunk_bytes: int = CHUNK_BYTES):
        self.path = path
        self.chunk_bytes = chunk_bytes
        self._offset = 0

    def read_new(self, final: bool = False) -> bytes:
        """The next chunk (at most ``chunk_bytes``, cut after a whole event), or b"" when caught up.

        ``final``: Horovod has stopped writing; everything left is returned, the last event
        too (the publisher repairs an event cut short by a crash).
        """
        try:
            with open(self.path, "rb") as f:
                f.seek(self._offset)
                data = f.read(self.chunk_bytes)
                more = bool(data) and len(data) == self.chunk_bytes and f.read(1) != b""
        except FileNotFoundError:
            return b""
        data = _repair_stale_closings(data)
        if more or not final:
            # Horovod ends the file with "}]" after each event and, for the next one,
            # seeks back over the "]" to write ",". So only bytes up to the last "},"
            # are final; the rest (the last event, maybe half-flushed) waits. A chunk
            # cut by the size limit ends at an event boundary the same way.
            cut = data.rfind(b"},")
            if cut < 0 and more:
                raise ValueError(f"{self.path}: no event boundary in {len(data)} bytes at offset {self._offset}: "
                                 "not a Horovod Timeline")
            data = data[: cut + 2] if cut >= 0 else b""
        self._offset += len(data)
        return data
