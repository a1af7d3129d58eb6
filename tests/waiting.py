"""One way for a test to wait: for something named, at most so long, and say both when it gives up.

A slow CI machine then fails with a reason ("waited 120 s for both ranks to write their pid files;
last seen: []"), not with a bare timeout.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_for(what: str, check: Callable[[], T], timeout: float, interval: float = 0.5,
             seen: Callable[[], object] | None = None, process: subprocess.Popen | None = None) -> T:
    """The first true value of ``check()``, tried every ``interval`` s. After ``timeout`` s, or once
    ``process`` (what should bring it about) has exited, an AssertionError naming ``what``, the seconds
    waited, and ``seen()`` (else the last value) then."""
    t0 = time.monotonic()
    while True:
        value = check()
        if value:
            return value
        waited = time.monotonic() - t0
        last = seen() if seen is not None else repr(value)
        if process is not None and process.poll() is not None:
            raise AssertionError(f"{_command(process.args)} exited ({process.returncode}) {waited:.0f} s into "
                                 f"waiting for {what}. Last seen: {last}")
        if waited >= timeout:
            raise AssertionError(f"waited {waited:.0f} s for {what}; gave up. Last seen: {last}")
        time.sleep(interval)


def _command(args) -> str:
    return "`" + (args if isinstance(args, str) else " ".join(str(part) for part in args))[:300] + "`"


def gave_up_on(exc: subprocess.TimeoutExpired) -> str:
    """What a command's timeout says in a test's failure: the command, how long, what it last wrote."""
    said = "".join(part.decode(errors="replace") if isinstance(part, bytes) else part
                   for part in (exc.stdout, exc.stderr) if part)
    return (f"waited {exc.timeout:.0f} s for {_command(exc.cmd)} to end; gave up. "
            f"Its last output: {said[-3000:] or '(none captured)'}")
