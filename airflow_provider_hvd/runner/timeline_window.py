"""Cut a time window out of a complete Horovod Timeline, for a trace too large for the viewer.

    python -m airflow_provider_hvd.runner.timeline_window SOURCE DEST --start 600 --duration 60

keeps the events from 600 s to 660 s after the timeline started, plus Horovod's metadata
events (the tensor names of every row), and writes them as a valid Chrome trace that
Perfetto or chrome://tracing opens. SOURCE and DEST are paths or fsspec URLs (``s3://...``
with s3fs installed). The source is read in blocks, so a multi-GiB timeline needs no more
memory than one block; DEST is written atomically.

Horovod's event times (``ts``) are microseconds since rank 0 started its timeline; the
viewer shows the same clock, so a window seen in the live view can be cut by its times.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Iterator

import fsspec

from airflow_provider_hvd.runner.common.storage import atomic_write_stream

_BLOCK = 8 << 20
_TS = re.compile(rb'"ts": (-?\d+)')
_METADATA = b'"ph": "M"'


class NotATimeline(ValueError):
    pass


def _events(source: str) -> Iterator[bytes]:
    """Each event of a Horovod Timeline (``{...}``), in file order; Horovod separates them with ``},``."""
    carry = b""
    with fsspec.open(source, "rb", block_size=_BLOCK) as f:
        first = f.read(_BLOCK)
        if not first.lstrip().startswith(b"["):
            raise NotATimeline(f"{source} does not start with '[': not a Horovod Timeline (Chrome trace array)")
        carry = first.lstrip()[1:]
        while True:
            parts = carry.split(b"},")
            carry = parts.pop()
            for part in parts:
                yield part.strip() + b"}"
            block = f.read(_BLOCK)
            if not block:
                break
            carry += block
            if len(carry) > 4 * _BLOCK:
                raise NotATimeline(f"{source}: no event boundary in {len(carry)} bytes: not a Horovod Timeline")
    last = carry.strip()
    if last.endswith(b"]"):
        last = last[:-1].rstrip()
    if last.endswith(b"}"):  # a half-written last event (a crashed run) is left out
        yield last


def cut_window(source: str, destination: str, start_s: float, duration_s: float | None) -> dict[str, int]:
    """Write the events of ``source`` with ``start_s <= ts < start_s + duration_s`` (and every metadata event)
    to ``destination``; return counts of events read and kept and bytes written."""
    low = int(start_s * 1e6)
    high = None if duration_s is None else int((start_s + duration_s) * 1e6)
    counts = {"events": 0, "kept": 0, "bytes": 0}

    def chunks() -> Iterator[bytes]:
        out, size, sep = [b"[\n"], 2, b""
        for event in _events(source):
            counts["events"] += 1
            if _METADATA not in event:
                match = _TS.search(event)
                if match is None:
                    continue
                ts = int(match.group(1))
                if ts < low or (high is not None and ts >= high):
                    continue
            counts["kept"] += 1
            out.append(sep + event)
            size += len(sep) + len(event)
            sep = b",\n"
            if size >= _BLOCK:
                counts["bytes"] += size
                yield b"".join(out)
                out, size = [], 0
        out.append(b"\n]\n")
        counts["bytes"] += size + 3
        yield b"".join(out)

    atomic_write_stream(destination, chunks())
    return counts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m airflow_provider_hvd.runner.timeline_window",
        description="Cut a time window out of a Horovod Timeline (path or fsspec URL) into a smaller valid trace.")
    parser.add_argument("source", help="the complete timeline, e.g. s3://bucket/run/timeline.json")
    parser.add_argument("destination", help="where the window goes, e.g. window.json")
    parser.add_argument("--start", type=float, default=0.0, help="seconds after the timeline started (default 0)")
    parser.add_argument("--duration", type=float, help="seconds to keep (default: to the end)")
    args = parser.parse_args(argv)
    if args.start < 0:
        parser.error(f"--start must be >= 0 seconds, got {args.start}")
    if args.duration is not None and args.duration <= 0:
        parser.error(f"--duration must be > 0 seconds, got {args.duration}")
    if str(args.source) == str(args.destination):
        parser.error("destination must differ from source: the window would replace the complete timeline")
    try:
        counts = cut_window(args.source, args.destination, args.start, args.duration)
    except FileNotFoundError as exc:
        print(f"timeline_window: no such timeline: {exc}", file=sys.stderr)
        return 2
    except NotATimeline as exc:
        print(f"timeline_window: {exc}", file=sys.stderr)
        return 2
    print(f"kept {counts['kept']} of {counts['events']} events ({counts['bytes'] / 2**20:.1f} MiB) in "
          f"{args.destination}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
