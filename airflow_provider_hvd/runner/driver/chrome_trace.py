"""Horovod's timeline as bytes: a Chrome-trace JSON array that stays open while Horovod writes it.
Where to cut it so that it parses, and the live view's parts (driver/timeline_publisher.py)."""

from __future__ import annotations


def chrome_trace_snapshot(raw: bytes) -> bytes:
    """Close Horovod's open JSON array held whole in memory (tests: the same cut the final write makes)."""
    body, closing = closed_body(raw)
    return raw[:body] + closing


def closed_body(tail: bytes) -> tuple[int, bytes]:
    """Where Horovod's array (whose last bytes are ``tail``) must be cut, and what closes it.

    Horovod ends the file with ``}]`` when it shuts down cleanly: kept as is. While it
    runs, or after a crash, the file ends with ``},`` or with half an event: cut after
    the last whole event and close with ``]``.
    """
    end = len(tail.rstrip())
    text = tail[:end]
    if text.endswith(b"}]"):
        return end, b""
    if text.endswith(b"},"):
        return end - 1, b"]"
    cut = text.rfind(b"},")
    if cut < 0:  # no whole event: an empty trace
        return 0, b"[]"
    return cut + 1, b"]"


def event_boundary_after(data: bytes, start: int) -> int:
    """Index of the first event that begins at or after ``start`` (Horovod separates events with ``},``)."""
    cut = data.find(b"},", max(0, start - 2))
    if cut < 0:
        return len(data)
    cut += 2
    while cut < len(data) and data[cut:cut + 1] in (b"\n", b" "):
        cut += 1
    return cut


def live_view_parts(chunks: list[bytes], metadata: list[bytes]) -> list[bytes]:
    """The live view (a valid Chrome trace) as parts to write one after another: no copy of the window."""
    while chunks:  # the newest events end with "," (more to come) or "]" (Horovod shut down)
        last = chunks[-1].rstrip()
        last = last[:-1].rstrip() if last.endswith(b"]") else last
        last = last.rstrip(b",").rstrip()
        if last:
            chunks[-1] = last
            break
        chunks.pop()
    metadata_part = b",\n".join(metadata)
    separator = b",\n" if metadata_part and chunks else b""
    return [b"[\n", metadata_part, separator, *chunks, b"\n]\n"]
