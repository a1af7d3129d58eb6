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


def check_np(np: object) -> int:
    """``np`` as HorovodRunner takes it, or a TypeError/ValueError saying what to pass."""
    if isinstance(np, bool) or not isinstance(np, int):
        raise TypeError(f"np takes an int, got {type(np).__name__} {np!r}: pass N > 0 for N ranks in a Spark "
                        "barrier stage, or -N for N ranks as subprocesses of the driver (debugging)")
    if np == 0:
        raise ValueError("np=0 runs nothing: pass np=N (N > 0) for N ranks in a Spark barrier stage, or "
                         "np=-N for N ranks as subprocesses of the driver (debugging).")
    return np
