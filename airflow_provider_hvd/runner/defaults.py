"""Every runner option, defined once: its name, default, check, text form, and one line of help.

``HorovodRunner`` (its keyword arguments, checked with ``Option.check``), the Spark application the
operator submits (``--options``, through ``Option.parse``), ``HorovodRunnerOperator`` (its arguments,
templated), the ``horovod`` connection's form (get_provider_info.CONN_FIELDS) and README.md's options
table all come from ``OPTIONS``; tests/test_options.py fails when one of them drifts.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

VERBOSITIES = ("all", "log_callback_only")
LAUNCHERS = ("auto", "gloo", "mpi")
NO_LIMIT = "none"  # how a template or a connection field spells "no limit" (None there means "not set here")
# The smallest live view of the timeline that holds a useful window of events.
MIN_TIMELINE_LIVE_BYTES = 64 << 10


def check_np(np: object) -> int:
    """``np`` as HorovodRunner takes it, or a TypeError/ValueError saying what to pass."""
    if isinstance(np, bool) or not isinstance(np, int):
        raise TypeError(f"np takes an int, got {type(np).__name__} {np!r}: pass N > 0 for N ranks in a Spark "
                        "barrier stage, or -N for N ranks as subprocesses of the driver (debugging)")
    if np == 0:
        raise ValueError("np=0 runs nothing: pass np=N (N > 0) for N ranks in a Spark barrier stage, or "
                         "np=-N for N ranks as subprocesses of the driver (debugging).")
    return np


# ---- checks of Python values, and how text becomes one ----

def _text_number(value: object) -> object:
    if isinstance(value, str):
        text = value.strip()
        for kind in (int, float):
            try:
                return kind(text)
            except ValueError:
                pass
        return NO_LIMIT if text.lower() == NO_LIMIT else value
    return value


def _text_args(value: object) -> object:
    if isinstance(value, str):
        import json  # here: the providers manager imports this module for the connection form
        import shlex

        text = value.strip()
        return json.loads(text) if text.startswith("[") else shlex.split(text)
    return value


def _seconds(name: str, optional: bool = False, allow_zero: bool = False) -> Callable[[object], float | None]:
    def check(value: object) -> float | None:
        if optional and (value is None or value == NO_LIMIT):
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0 or \
                (value == 0 and not allow_zero):
            raise ValueError(f"{name} takes a number of seconds {'>= 0' if allow_zero else '> 0'}"
                             + (f" or {NO_LIMIT!r} (None) for no limit" if optional else "") + f", got {value!r}")
        return float(value)
    return check


def _choice(name: str, choices: tuple[str, ...]) -> Callable[[object], str]:
    def check(value: object) -> str:
        if value not in choices:
            raise ValueError(f"{name}={value!r} is not known: use one of {', '.join(choices)}")
        return str(value)
    return check


def _args(value: object) -> tuple[str, ...]:
    if isinstance(value, str):
        raise TypeError(f"mpi_args must be a list of arguments, got the string {value!r} (a template or a "
                        "connection field may give one string of them)")
    if not isinstance(value, (list, tuple)) or not all(isinstance(a, (str, int, float)) for a in value):
        raise ValueError(f"mpi_args takes a list of arguments (or one string of them), got {value!r}")
    return tuple(str(a) for a in value)


def check_max_restarts(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"max_restarts takes an int >= 0 (restarts after a lost executor, host or rank; 0: none), "
                         f"got {value!r}")
    return value


def check_timeline_live_bytes(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"timeline_live_bytes takes an int >= 0 (bytes of recent events in the live view; 0 turns "
                         f"it off), got {value!r}")
    if 0 < value < MIN_TIMELINE_LIVE_BYTES:
        raise ValueError(f"timeline_live_bytes={value} is too small to hold a useful window of events: pass at "
                         f"least {MIN_TIMELINE_LIVE_BYTES} (64 KiB), or 0 to turn the live view off")
    return value


# ---- the options ----

@dataclass(frozen=True)
class Option:
    """One option of a run. ``check``: a Python value, as HorovodRunner takes it, checked and
    normalised (or a ValueError/TypeError naming the option); ``text``: how a value that may be text
    (a rendered template, a connection form) becomes one first."""

    name: str
    default: object
    check: Callable[[object], object]
    help: str
    label: str
    schema: dict = field(default_factory=dict)  # JSON schema of the connection form's field
    text: Callable[[object], object] = _text_number

    def parse(self, value: object) -> object:
        return self.check(self.text(value))

    def shown_default(self) -> str:
        if self.default in (None, ()):
            return "none"
        return str(int(self.default) if isinstance(self.default, float) and self.default.is_integer()
                   else self.default)


def _nullable(kind: str | list[str], **schema: object) -> dict:
    kinds = [kind] if isinstance(kind, str) else kind
    return {"type": [*kinds, "null"], **schema}


OPTIONS: dict[str, Option] = {option.name: option for option in (
    Option("driver_log_verbosity", "all", _choice("driver_log_verbosity", VERBOSITIES),
           "`all`: every rank's stdout and stderr; `log_callback_only`: only `log_to_driver` messages",
           "Rank output in the task log", _nullable("string", enum=[*VERBOSITIES, None]), text=lambda v: v),
    Option("launcher", "auto", _choice("launcher", LAUNCHERS),
           "`mpi`, `gloo`, or `auto` (mpi when OpenMPI and an MPI-enabled horovod are present)",
           "Launcher", _nullable("string", enum=[*LAUNCHERS, None]), text=lambda v: v),
    Option("mpi_args", (), _args, "extra mpirun arguments (launcher mpi): a list, or one string of them",
           "Extra mpirun arguments", _nullable(["string", "array"]), text=_text_args),
    Option("start_timeout", 120.0, _seconds("start_timeout"), "seconds for every rank to start",
           "Start timeout (s)", _nullable("number", exclusiveMinimum=0)),
    Option("stall_timeout", 600.0, _seconds("stall_timeout", optional=True),
           "seconds a rank may wait in a collective the others never join (`none`: forever)",
           "Stall timeout (s)", _nullable(["number", "string"])),
    Option("timeout", None, _seconds("timeout", optional=True), "seconds for the whole training run",
           "Run timeout (s)", _nullable(["number", "string"])),
    Option("slot_wait_timeout", 30.0, _seconds("slot_wait_timeout", allow_zero=True),
           "seconds to wait for np free task slots, before the first attempt and each restart",
           "Slot wait (s)", _nullable("number", minimum=0)),
    Option("timeline_interval", 5.0, _seconds("timeline_interval"),
           "seconds between refreshes of the timeline's live view", "Timeline refresh (s)",
           _nullable("number", exclusiveMinimum=0)),
    Option("timeline_live_bytes", 8 << 20, check_timeline_live_bytes,
           "size of the timeline's live view of recent events (0: no live view)", "Timeline live view (bytes)",
           _nullable("integer", minimum=0)),
    Option("max_restarts", 0, check_max_restarts,
           "restarts of the ranks after a lost executor, host or rank, each from the run's newest checkpoint",
           "Max restarts", _nullable("integer", minimum=0)),
)}

TIMELINE_LIVE_BYTES = OPTIONS["timeline_live_bytes"].default


def default(name: str) -> object:
    return OPTIONS[name].default


def parse_option(name: str, value: object) -> object:
    """``value`` of runner option ``name`` (Python or text) checked and normalised, or an error naming it."""
    return OPTIONS[name].parse(value)


def parse_np(value: object) -> int:
    """``np`` from Python or from a rendered template ("2", "-2")."""
    return check_np(_text_number(value) if isinstance(value, str) else value)


def param_doc(indent: str = "    ") -> str:
    """The options as ``:param name: help (default ...)`` lines, for a docstring."""
    return "\n".join(f"{indent}:param {o.name}: {o.help.replace('`', '``')} (default {o.shown_default()})."
                     for o in OPTIONS.values())


def readme_table() -> str:
    """README.md's options table."""
    rows = [f"| `{o.name}` | {'`' + o.shown_default() + '`' if isinstance(o.default, str) else o.shown_default()} "
            f"| {o.help} |" for o in OPTIONS.values()]
    return "\n".join(["| option | default | meaning |", "| --- | --- | --- |", *rows])
