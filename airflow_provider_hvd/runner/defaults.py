"""Every default of a run, and the checks of its options, defined once.

``HorovodRunner``, the Spark application the operator submits (spark_app.py) and
``HorovodRunnerOperator`` all take these from here, so changing a default changes it
everywhere.
"""

from __future__ import annotations

VERBOSITIES = ("all", "log_callback_only")
LAUNCHERS = ("auto", "gloo", "mpi")

DRIVER_LOG_VERBOSITY = "all"
LAUNCHER = "auto"
START_TIMEOUT_S = 120.0
STALL_TIMEOUT_S = 600.0
TIMEOUT_S: float | None = None
SLOT_WAIT_TIMEOUT_S = 30.0
TIMELINE_INTERVAL_S = 5.0
# The timeline's live view: the most recent events, as a valid trace of at most this size
# (Perfetto and chrome://tracing open it in a second); 0 turns the live view off.
TIMELINE_LIVE_BYTES = 8 << 20
# Restarts of the rank group within one run after a curable failure (driver/restart_policy.py).
MAX_RESTARTS = 0


def check_max_restarts(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"max_restarts takes an int >= 0 (restarts after a lost executor, host or rank; 0: none), "
                         f"got {value!r}")
    return value


def check_timeline_live_bytes(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"timeline_live_bytes takes an int >= 0 (bytes of recent events in the live view; 0 turns "
                         f"it off), got {value!r}")
    if 0 < value < 64 << 10:
        raise ValueError(f"timeline_live_bytes={value} is too small to hold a useful window of events: pass at "
                         f"least {64 << 10} (64 KiB), or 0 to turn the live view off")
    return value


def check_np(np: object) -> int:
    """``np`` as HorovodRunner takes it, or a TypeError/ValueError saying what to pass."""
    if isinstance(np, bool) or not isinstance(np, int):
        raise TypeError(f"np takes an int, got {type(np).__name__} {np!r}: pass N > 0 for N ranks in a Spark "
                        "barrier stage, or -N for N ranks as subprocesses of the driver (debugging)")
    if np == 0:
        raise ValueError("np=0 runs nothing: pass np=N (N > 0) for N ranks in a Spark barrier stage, or "
                         "np=-N for N ranks as subprocesses of the driver (debugging).")
    return np
