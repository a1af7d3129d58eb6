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


# ---- Every runner option, as the operator and its connection pass them -------------------------------------
# HorovodRunnerOperator takes each of these as an argument; unset (None) falls back to the
# ``horovod`` connection's field of the same name, then to the default here. Values may
# arrive as text (a template, a connection form), so each parser takes both and says what
# is wrong, naming the option. They reach the Spark application as one JSON argument.

NO_LIMIT = "none"  # how the operator and the connection spell "no limit" (None means "not set here")


def _text_number(value: object) -> object:
    if isinstance(value, str):
        text = value.strip()
        try:
            return int(text)
        except ValueError:
            try:
                return float(text)
            except ValueError:
                return value
    return value


def _seconds(name: str, optional: bool = False, allow_zero: bool = False):
    def parse(value: object) -> float | None:
        if optional and (value is None or (isinstance(value, str) and value.strip().lower() == NO_LIMIT)):
            return None
        number = _text_number(value)
        if isinstance(number, bool) or not isinstance(number, (int, float)) or number < 0 or \
                (number == 0 and not allow_zero):
            raise ValueError(f"{name} takes a number of seconds {'>= 0' if allow_zero else '> 0'}"
                             + (f" or {NO_LIMIT!r} for no limit" if optional else "") + f", got {value!r}")
        return float(number)
    return parse


def _choice(name: str, choices: tuple[str, ...]):
    def parse(value: object) -> str:
        if value not in choices:
            raise ValueError(f"{name}={value!r}: use one of {', '.join(choices)}")
        return str(value)
    return parse


def _args(name: str):
    def parse(value: object) -> tuple[str, ...]:
        import json
        import shlex

        if isinstance(value, str):
            text = value.strip()
            value = json.loads(text) if text.startswith("[") else shlex.split(text)
        if not isinstance(value, (list, tuple)) or not all(isinstance(a, (str, int, float)) for a in value):
            raise ValueError(f"{name} takes a list of arguments (or one string of them), got {value!r}")
        return tuple(str(a) for a in value)
    return parse


def _whole(check):
    return lambda value: check(_text_number(value))


OPTIONS: dict[str, tuple[object, object]] = {
    # name: (default, parser)
    "driver_log_verbosity": (DRIVER_LOG_VERBOSITY, _choice("driver_log_verbosity", VERBOSITIES)),
    "launcher": (LAUNCHER, _choice("launcher", LAUNCHERS)),
    "mpi_args": ((), _args("mpi_args")),
    "start_timeout": (START_TIMEOUT_S, _seconds("start_timeout")),
    "stall_timeout": (STALL_TIMEOUT_S, _seconds("stall_timeout", optional=True)),
    "timeout": (TIMEOUT_S, _seconds("timeout", optional=True)),
    "slot_wait_timeout": (SLOT_WAIT_TIMEOUT_S, _seconds("slot_wait_timeout", allow_zero=True)),
    "timeline_interval": (TIMELINE_INTERVAL_S, _seconds("timeline_interval")),
    "timeline_live_bytes": (TIMELINE_LIVE_BYTES, _whole(check_timeline_live_bytes)),
    "max_restarts": (MAX_RESTARTS, _whole(check_max_restarts)),
}


def parse_option(name: str, value: object) -> object:
    """``value`` of runner option ``name`` checked and normalised, or a ValueError naming it."""
    return OPTIONS[name][1](value)


def parse_np(value: object) -> int:
    """``np`` from Python or from a rendered template ("2", "-2")."""
    return check_np(_text_number(value) if isinstance(value, str) else value)
