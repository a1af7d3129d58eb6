"""What code running inside a rank can use: ``log_to_driver`` and the rank's own channel."""

from __future__ import annotations

import os
import threading

from airflow_provider_hvd.runner.wire.messages import Op, Stream

_channel = None
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
    channel.send_json({"op": Op.LOG, "stream": Stream.LOG, "line": text})


def current_rank() -> int | None:
    """This process's Horovod rank when it runs under HorovodRunner, else None."""
    value = os.environ.get("HOROVOD_RANK")
    return int(value) if value is not None else None


def _install(channel) -> None:
    global _channel
    with _lock:
        _channel = channel
