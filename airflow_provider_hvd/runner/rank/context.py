"""What code running inside a rank can use: ``log_to_driver`` and the rank's own channel."""

from __future__ import annotations

import os
import threading

from airflow_provider_hvd.runner.wire.messages import Log, Stream

_channel = None
_rank: int | None = None
_lock = threading.Lock()


def log_to_driver(message: object) -> None:
    """Send ``message`` to the driver's log, prefixed with this rank.

    It reaches the driver whatever ``driver_log_verbosity`` is, so it is the way
    to report progress (``log_to_driver(f"epoch {e} loss {loss:.4f}")``). Called
    outside a HorovodRunner rank (testing ``main`` directly) it prints.
    """
    text = str(message)
    with _lock:
        channel = _channel
    if channel is None:
        print(text, flush=True)
        return
    channel.send_message(Log(line=text, stream=Stream.LOG))


def current_rank() -> int | None:
    """This process's Horovod rank when it runs under HorovodRunner, else None.

    The rank the runner started this process as; failing that, the launcher's variable: gloo sets
    HOROVOD_RANK, mpirun only OMPI_COMM_WORLD_RANK (reading HOROVOD_RANK alone, every rank under
    mpirun counted as rank 0 and wrote the rank-0-only checkpoints, all of them to the same key).
    """
    if _rank is not None:
        return _rank
    for name in ("HOROVOD_RANK", "OMPI_COMM_WORLD_RANK"):
        value = os.environ.get(name)
        if value is not None:
            return int(value)
    return None


def _install(channel, rank: int) -> None:
    global _channel, _rank
    with _lock:
        _channel = channel
        _rank = rank
