"""A rank's output as the lines the task log shows, while it is written.

Whole lines go out as soon as they end. A line a progress bar redraws with ``\\r`` (tqdm,
Keras' ``Progbar``) has no end until the bar is done, so reading on ``\\n`` alone would show
nothing while training runs and every state at once at the end; a fast bar shown state by
state would flood the log. So a redrawn line is shown as its latest state, at most once per
``REDRAW_INTERVAL_S`` per stream, and its final state when the line ends.

Both launchers read their pipes with ``pump``: the gloo launcher reads one rank's stdout or
stderr, the mpi launcher reads mpirun's, which carries every rank's output in tagged chunks
(mpi_output.TaggedOutput) that it hands to one ``LineAssembler`` per rank and stream.
"""

from __future__ import annotations

import codecs
import os
import re
import selectors
import time
from typing import Callable, Iterable

REDRAW_INTERVAL_S = 1.0
_BREAK = re.compile(r"(\r|\n)")
_READ_SIZE = 65536


class LineAssembler:
    """One stream's text in, lines out through ``emit``.

    ``\\r`` returns the cursor to the start of the line: the text before it was one complete
    state of a redrawn line, the text after it the next (written in one ``write`` by tqdm and
    Keras, and a pipe delivers such a write whole). ``\\r\\n`` ends a line like ``\\n``."""

    def __init__(self, emit: Callable[[str], None], interval: float = REDRAW_INTERVAL_S,
                 clock: Callable[[], float] = time.monotonic):
        self._emit = emit
        self._interval = interval
        self._clock = clock
        self._current = ""                  # text since the last \r or \n
        self._redrawn = False               # a \r was seen since the last \n
        self._last_state: str | None = None  # the latest complete state of the redrawn line
        self._shown: str | None = None      # the state last shown of this line
        self._shown_at = float("-inf")

    def feed(self, text: str) -> None:
        for piece in _BREAK.split(text):
            if piece == "\n":
                self._end_line()
            elif piece == "\r":
                if self._current:
                    self._last_state = self._current
                self._current = ""
                self._redrawn = True
            else:
                self._current += piece
        self.tick()

    def due(self) -> float | None:
        """When ``tick`` next has something to show: None while nothing waits."""
        state = self._state()
        if state is None or state == self._shown:
            return None
        return self._shown_at + self._interval

    def tick(self) -> None:
        """Show the redrawn line's latest state if the interval since the last one has passed."""
        due = self.due()
        if due is not None and self._clock() >= due:
            self._show(self._state())

    def close(self) -> None:
        """The stream ended: what is left of its last line is shown."""
        if self._current or (self._redrawn and self.due() is not None):
            self._end_line()

    def _state(self) -> str | None:
        if not self._redrawn:
            return None
        return self._current or self._last_state

    def _show(self, state: str) -> None:
        self._shown, self._shown_at = state, self._clock()
        self._emit(state)

    def _end_line(self) -> None:
        if not self._redrawn:
            self._emit(self._current)  # an ordinary line, blank ones included: never held back
        else:
            final = self._state()
            if final is not None and final != self._shown:  # a bar's final state, once
                self._emit(final)
            if final is not None:
                self._shown_at = self._clock()
        self._current, self._redrawn, self._last_state, self._shown = "", False, None, None


def pump(stream, feed: Callable[[str], None], assemblers: Callable[[], Iterable[LineAssembler]],
         end: Callable[[], None] | None = None) -> None:
    """Read ``stream`` (a pipe) until it ends, giving its text to ``feed`` as it arrives, and
    waking for the assemblers' throttled redraws when no text comes. At the end ``end`` is
    called, then every assembler shows what is left. Closes the stream."""
    fd = stream.fileno()
    decoder = codecs.getincrementaldecoder("utf-8")("replace")
    # A selector (epoll), not select(): select() refuses descriptors above 1023, and a long-lived
    # executor's Python worker may hold that many.
    selector = selectors.DefaultSelector()
    selector.register(fd, selectors.EVENT_READ)
    try:
        while True:
            dues = [due for a in assemblers() if (due := a.due()) is not None]
            timeout = max(0.0, min(dues) - time.monotonic()) if dues else None
            ready = selector.select(timeout)
            if ready:
                chunk = os.read(fd, _READ_SIZE)
                if not chunk:
                    feed(decoder.decode(b"", final=True))
                    if end is not None:
                        end()
                    for assembler in assemblers():
                        assembler.close()
                    return
                feed(decoder.decode(chunk))
            for assembler in assemblers():
                assembler.tick()
    finally:
        selector.close()
        stream.close()
