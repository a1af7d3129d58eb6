"""Set-up that waits on the disk and the package index more than on the CPU (this package's
distributions, fresh environments installed from them), begun when collection ends so that it runs
while the first tests do, at the lowest CPU priority.

A test module declares such a step with ``@early.step(fixture)``; once pytest has collected the
session, every step whose fixture a selected test uses starts, one at a time (they share uv's cache
and the disk); the fixture then takes ``early.result(name)``, which waits for it, or runs it there
if it had not begun (a run of that module alone).
"""

from __future__ import annotations

import shutil
import tempfile
import threading
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path

# Lowest CPU and disk priority for a step's commands: the tests running meanwhile keep what they need.
NICE = ["nice", "-n", "19", *(["ionice", "-c", "3"] if shutil.which("ionice") else [])]

_steps: dict[str, tuple[str, tuple[str, ...], Callable]] = {}
_started: dict[str, Future] = {}
_one_at_a_time = threading.Lock()
_lock = threading.Lock()
_root: Path | None = None


def step(fixture: str, needs: tuple[str, ...] = ()):
    """Declare the decorated function (named as the step) as early set-up for tests using ``fixture``;
    it is called with the results of the steps it ``needs``, in order."""
    def register(fn: Callable) -> Callable:
        _steps[fn.__name__] = (fixture, needs, fn)
        return fn
    return register


def folder(name: str) -> Path:
    """A fresh folder for a step's files, removed when the session ends."""
    global _root
    with _lock:
        if _root is None:
            _root = Path(tempfile.mkdtemp(prefix="hvd-tests-early-"))
    return Path(tempfile.mkdtemp(prefix=f"{name}-", dir=_root))


def start_for(fixtures: set[str]) -> list[str]:
    """Start every step for one of ``fixtures``; the names of those started."""
    names = [name for name, (fixture, _, _) in _steps.items() if fixture in fixtures]
    for name in names:
        _start(name)
    return names


def result(name: str):
    """The step's result, once it is done (re-raising what it raised)."""
    return _start(name).result()


def _start(name: str) -> Future:
    with _lock:
        if name in _started:
            return _started[name]
        future: Future = Future()
        _started[name] = future
    _, needs, fn = _steps[name]
    for need in needs:
        _start(need)

    def run() -> None:
        try:
            inputs = [result(need) for need in needs]
            with _one_at_a_time:
                future.set_result(fn(*inputs))
        except BaseException as exc:  # noqa: BLE001 - handed to whoever waits for the result
            future.set_exception(exc)

    threading.Thread(target=run, name=f"early-{name}", daemon=True).start()
    return future


def finish() -> None:
    """Wait for the steps still running (a session cut short), then remove their folders."""
    for future in list(_started.values()):
        try:
            future.result()
        except BaseException:  # noqa: BLE001 - the test that needed it has reported it
            pass
    if _root is not None:
        shutil.rmtree(_root, ignore_errors=True)
