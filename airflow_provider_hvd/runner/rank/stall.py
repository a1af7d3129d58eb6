"""Stalled ranks: a collective that some ranks wait in and others never join.

Horovod's own stall check cannot end such a run: its shutdown needs the stalled
rank's cooperation (a rank that sleeps ends the job only when it wakes, under
horovodrun as under us).
So each rank watches its own collectives from a thread: horovod.torch keeps every
submitted, not yet completed operation in ``mpi_ops._handle_map``; one that stays
there longer than ``stall_timeout`` means this rank waits for peers, and it tells
the driver. The driver names the ranks that did *not* report waiting: those are
the ones that never joined (see monitor.RunMonitor).
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Any, Callable

from airflow_provider_hvd.runner.wire.messages import Log, Stalled, Stream

POLL_S = 1.0
TENSORFLOW_NOT_WATCHED = ("HorovodRunner: stall_timeout does not cover horovod.tensorflow collectives; a hung "
                          "TensorFlow rank is stopped by the run's timeout= (docs/tensorflow.md)")


def pending_collectives() -> set[int] | None:
    """Handles of this process's submitted, unfinished horovod.torch operations (None: not imported).

    The one use of a private horovod API: ``horovod.torch.mpi_ops._handle_map`` (handle ->
    (tensor, output), filled by every ``*_async`` call and emptied by ``synchronize``) in horovod
    0.28.1, the version scripts/setup.sh builds. horovod has no public "what is pending" call.
    tests/test_private_apis.py fails naming it when a horovod upgrade changes it; until then a
    changed map makes this return None, which turns the stall watch off, never on."""
    ops = sys.modules.get("horovod.torch.mpi_ops")
    handles = getattr(ops, "_handle_map", None) if ops is not None else None
    if handles is None:
        return None
    for _ in range(5):
        try:
            return set(handles)
        except RuntimeError:  # changed size while the training thread submitted or completed one
            continue
    return set()


def watch(report: Callable[[dict[str, Any]], None], timeout: float, poll: float = POLL_S,
          announce: bool = False) -> threading.Thread:
    """Report once, from a daemon thread, when a collective has been pending longer than ``timeout``.
    ``announce`` (rank 0): say in the log when the collectives are TensorFlow's, which it cannot watch."""

    def loop() -> None:
        first_seen: dict[int, float] = {}
        told_tensorflow = False
        while True:
            time.sleep(poll)
            now = time.monotonic()
            pending = pending_collectives()
            if announce and pending is None and not told_tensorflow and "horovod.tensorflow" in sys.modules:
                # TF's collectives run inside TF ops: nothing Python can watch. Horovod's own stall
                # inspector does not help either: its coordinator blocks in the same exchange as
                # the idle rank (docs/tensorflow.md). Say so rather than seem to watch.
                told_tensorflow = True
                report(Log(line=TENSORFLOW_NOT_WATCHED, stream=Stream.LOG))
            first_seen = {h: first_seen.get(h, now) for h in pending or ()}
            if first_seen and now - min(first_seen.values()) > timeout:
                report(Stalled(waiting_s=round(now - min(first_seen.values()), 1), pending=len(first_seen)))
                return

    thread = threading.Thread(target=loop, name="hvd-stall-watch", daemon=True)
    thread.start()
    return thread
