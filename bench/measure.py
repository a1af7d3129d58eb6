"""What every bench section measures with: the runner's own log lines with their times, and medians."""

from __future__ import annotations

import logging
import statistics


class PhaseLog(logging.Handler):
    """Timestamps of the runner's own progress lines, for the launch breakdown and the restart's parts."""

    def __init__(self):
        super().__init__()
        self.marks: list[tuple[float, str]] = []

    def emit(self, record):
        self.marks.append((record.created, record.getMessage()))

    def first(self, text, after=0.0):
        return next((t for t, m in self.marks if t >= after and text in m), None)


def stats(values):
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}
