"""The records inside messages and marker lines (a roster's task, a dead Open MPI process), and how a
frame's fields become a declared type: what wire/messages.py, hellos.py and launch.py build on."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any


def from_fields(cls: type, data: dict[str, Any]) -> Any:
    """``cls`` from a frame's fields: a field the frame lacks takes its default, one the type does not
    declare is left out (a peer of a later release may say more)."""
    names = {f.name for f in dataclasses.fields(cls)}
    return cls(**{name: value for name, value in data.items() if name in names})


def as_type(cls: type, value: Any) -> Any:
    """A nested field as its declared type: a frame carries it as a dict (``None`` stays ``None``)."""
    if value is None or isinstance(value, cls):
        return value
    if not isinstance(value, dict):
        raise ValueError(f"a {cls.__name__} must be an object, got {value!r:.100}")
    try:
        return from_fields(cls, value)
    except TypeError as exc:
        raise ValueError(f"a {cls.__name__} without its fields: {exc}") from None


@dataclass(frozen=True)
class TaskInfo:
    """What a barrier task says of itself when it joins the roster."""
    host: str                    # the address its executor binds to: where the other tasks reach it
    hostname: str | None = None
    rsh_port: int | None = None  # mpi: its host's rsh service for mpirun's agent
    gpus: str | None = None      # mpi: its GPU addresses, comma-separated

    def __post_init__(self) -> None:
        if not isinstance(self.host, str) or not self.host:
            raise ValueError(f"a task info without a host: {self!r:.200}")


@dataclass(frozen=True)
class DaemonDeath:
    """An Open MPI process killed by a signal: an orted (its rsh agent saw it end) or mpirun itself."""
    process: str = "orted"
    host: str = "?"
    signal: str = "?"
    code: int | None = None
