"""Rank 0's Horovod Timeline, read as it grows: the launcher's side of timeline delivery.

Horovod's rank 0 writes a Chrome-trace JSON array to a local file (``HOROVOD_TIMELINE``),
rewriting its last byte as each event is appended. The rank's launcher tails that file
and its DriverLink sends the bytes that can no longer change to the driver every few
seconds, where driver/timeline_publisher.py delivers them.
"""

from __future__ import annotations


class TimelineTail:
    """Reads what Horovod appended to the local timeline since the last call, whole events only."""

    def __init__(self, path: str):
        self.path = path
        self._offset = 0

    def read_new(self, final: bool = False) -> bytes:
        try:
            with open(self.path, "rb") as f:
                f.seek(self._offset)
                data = f.read()
        except FileNotFoundError:
            return b""
        if not final:
            # Horovod ends the file with "}]" after each event and, for the next one,
            # seeks back over the "]" to write ",". So only bytes up to the last "},"
            # are final; the rest (the last event, maybe half-flushed) waits.
            cut = data.rfind(b"},")
            data = data[: cut + 2] if cut >= 0 else b""
        self._offset += len(data)
        return data
