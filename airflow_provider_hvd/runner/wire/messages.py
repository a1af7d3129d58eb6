"""Every message the processes of a run exchange, declared once.

A run's processes talk over authenticated channels (channel.py). Each connection
opens with a *hello* naming the peer's ``Role``; after that every JSON frame carries
an ``"op"`` from ``Op``, and some are followed by one bytes frame (``CARRIES_BYTES``).
On the driver, whatever matters for the run's outcome becomes an ``Event`` of a
``EventKind`` (driver/service.py) that driver/monitor.py reads.

Each message is a declared type below (a frozen dataclass with its fields); senders build one
and send it (``channel.send_message``), receivers get one back from ``parse``/``parse_hello``,
so an unknown op or role is a ValueError naming it, never a message silently ignored, and
no field is read by a bare key. tests/test_layout.py checks that no module spells an op,
role, stream or event as a bare string, and that every ``Op.X`` it names exists.

Who sends what (the fields are on each type below):

  hello, answered by the server with ``{"ok": true}``: TaskHello (a barrier task), KvHello (a
    rendezvous proxy), LauncherHello (a rank's launcher, or mpirun's for all), RankHello, RshAgentHello
  rank -> driver       GetPayload (answered by the sealed call, bytes), Log, RankException, Stalled,
                       Returned, Result + bytes (rank 0), Bye
  launcher -> driver   Log, Diagnostic, Timeline + bytes, Exited, Bye
  task -> driver       Bye; driver -> task: Roster; driver -> launcher and task: Stop
  proxy -> driver      KvGet / KvPut + bytes / KvDelete, Bye; answered by KvStatus (+ bytes)
  agent -> rsh service Exec; answered by Out ... then Exit
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass, field
from typing import Any, ClassVar

from airflow_provider_hvd.runner.wire.records import DaemonDeath, TaskInfo, as_type, from_fields


class Role(enum.StrEnum):
    """Who opened a connection (the ``role`` of its hello)."""
    TASK = "task"              # a barrier task, joining the roster
    KV = "kv"                  # a gloo rank's rendezvous proxy
    LAUNCHER = "launcher"      # what started a rank process (RankProcess) or all of them (MpiRun)
    RANK = "rank"              # the rank process itself
    RSH_AGENT = "rsh-agent"    # mpirun's rsh agent, asking a host's barrier task to start orted


class Op(enum.StrEnum):
    """The ``op`` of every message after the hello."""
    # rank -> driver
    GET_PAYLOAD = "get_payload"
    EXCEPTION = "exception"
    STALLED = "stalled"
    RETURNED = "returned"
    RESULT = "result"
    # rank or launcher -> driver
    LOG = "log"
    # launcher -> driver
    DIAGNOSTIC = "diagnostic"
    TIMELINE = "timeline"
    EXITED = "exited"
    # any peer -> the one it leaves: it is done, not dead
    BYE = "bye"
    # driver -> task / launcher
    ROSTER = "roster"
    STOP = "stop"
    # rendezvous proxy -> driver's key-value store
    KV_GET = "get"
    KV_PUT = "put"
    KV_DELETE = "delete"
    # rsh agent <-> a host's rsh service
    EXEC = "exec"
    OUT = "out"
    EXIT = "exit"


# Ops whose JSON frame is followed by exactly one bytes frame.
CARRIES_BYTES = frozenset({Op.RESULT, Op.TIMELINE, Op.KV_PUT})


class Stream(enum.StrEnum):
    """Where a logged line came from (the ``<stream>`` of ``[rank]<stream>: line``)."""
    STDOUT = "stdout"
    STDERR = "stderr"
    LOG = "log"          # log_to_driver, and the runner's own notes from a rank
    MPIRUN = "mpirun"    # mpirun's own words, not a rank's


class EventKind(enum.StrEnum):
    """What the driver service tells the monitor (driver/service.py's ``Event.kind``)."""
    RANK_STARTED = "rank_started"          # a rank process connected
    RANK_CLOSED = "rank_closed"            # its channel ended (after its result, for rank 0)
    LAUNCHER_STARTED = "launcher_started"  # its launcher connected (one per rank it holds)
    LAUNCHER_LOST = "launcher_lost"        # a launcher or task vanished without BYE: its executor died
    LAUNCHER_SAID = "launcher_said"        # mpirun's own line or a start snapshot, quoted if start fails
    EXCEPTION = "exception"                # the training function raised
    EXITED = "exited"                      # a rank process ended (returncode, signal, tail)
    RETURNED = "returned"                  # the training function returned
    RESULT = "result"                      # rank 0's sealed result (the event's blob)
    STALLED = "stalled"                    # a collective pending past stall_timeout


# ---- the messages, declared ----------------------------------------------------------------

_BY_OP: dict[Op, type[Message]] = {}


@dataclass(frozen=True)
class Message:
    """A JSON frame after the hello; ``op`` says which type."""

    op: ClassVar[Op]

    def __init_subclass__(cls, op: Op | None = None, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if op is not None:
            cls.op = op
            _BY_OP[op] = cls

    def to_wire(self) -> dict[str, Any]:
        return {"op": self.op, **dataclasses.asdict(self)}


def parse(data: dict[str, Any]) -> Message:
    """The message a frame carries; a ValueError naming an op nobody declared."""
    op = Op(data.get("op"))
    try:
        return from_fields(_BY_OP[op], data)
    except TypeError as exc:  # a field the type needs is missing
        raise ValueError(f"a {op} frame without its fields: {exc}") from None


@dataclass(frozen=True)
class GetPayload(Message, op=Op.GET_PAYLOAD):
    """Answered by the sealed call, as bytes."""


@dataclass(frozen=True)
class Log(Message, op=Op.LOG):
    line: str = ""
    stream: str = Stream.LOG
    rank: int | None = None  # a launcher speaking for a rank (mpirun: for every rank)


@dataclass(frozen=True)
class Diagnostic(Message, op=Op.DIAGNOSTIC):
    """A launcher's account of a slow start, quoted if the ranks never start."""
    line: str = ""


@dataclass(frozen=True)
class RankException(Message, op=Op.EXCEPTION):
    type: str
    message: str
    traceback: str = ""
    hint: str | None = None
    while_loading: bool = False
    rank: int | None = None


@dataclass(frozen=True)
class Stalled(Message, op=Op.STALLED):
    waiting_s: float = 0.0
    pending: int = 0
    rank: int | None = None


@dataclass(frozen=True)
class Returned(Message, op=Op.RETURNED):
    rank: int | None = None


@dataclass(frozen=True)
class Result(Message, op=Op.RESULT):
    """Rank 0's sealed result follows as bytes."""
    size: int = 0


@dataclass(frozen=True)
class Timeline(Message, op=Op.TIMELINE):
    """A chunk of rank 0's timeline follows as bytes."""
    size: int = 0


@dataclass(frozen=True)
class Exited(Message, op=Op.EXITED):
    """A rank process ended. ``daemon``: the Open MPI process whose death ended it, if one did."""
    rank: int | None = None
    returncode: int | None = None
    host: str | None = None
    pid: int | None = None
    tail: list[str] = field(default_factory=list)
    signal: str | None = None
    stopped_by_driver: bool = False
    daemon: DaemonDeath | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "daemon", as_type(DaemonDeath, self.daemon))


@dataclass(frozen=True)
class Bye(Message, op=Op.BYE):
    pass


@dataclass(frozen=True)
class Roster(Message, op=Op.ROSTER):
    """Every barrier task's info, in partition order."""
    tasks: list[TaskInfo] = field(default_factory=list)

    def __post_init__(self) -> None:
        object.__setattr__(self, "tasks", [as_type(TaskInfo, t) for t in self.tasks])


@dataclass(frozen=True)
class Stop(Message, op=Op.STOP):
    pass


@dataclass(frozen=True)
class KvGet(Message, op=Op.KV_GET):
    scope: str = ""
    key: str = ""


@dataclass(frozen=True)
class KvPut(Message, op=Op.KV_PUT):
    """The value follows as bytes."""
    scope: str = ""
    key: str = ""


@dataclass(frozen=True)
class KvDelete(Message, op=Op.KV_DELETE):
    scope: str = ""
    key: str = ""


@dataclass(frozen=True)
class KvStatus:
    """The store's answer to a KvGet, KvPut or KvDelete (HTTP's codes); a found value follows as bytes."""
    status: int

    def to_wire(self) -> dict[str, Any]:
        return {"status": self.status}

    @classmethod
    def from_wire(cls, data: dict[str, Any]) -> KvStatus:
        return cls(status=int(data["status"]))


@dataclass(frozen=True)
class Exec(Message, op=Op.EXEC):
    command: str = ""  # orted's command line, run by /bin/sh


@dataclass(frozen=True)
class Out(Message, op=Op.OUT):
    stream: str = Stream.STDOUT
    data: str = ""


@dataclass(frozen=True)
class Exit(Message, op=Op.EXIT):
    code: int = 0


# ---- what the driver service tells the monitor beyond the peers' own messages ----

@dataclass(frozen=True)
class Lost:
    """A launcher or barrier task left without saying bye: its executor died, or its host stopped
    answering (``unreachable``)."""
    host: str = "?"
    hostname: str | None = None
    pid: int | None = None
    unreachable: bool = False


# What a rendezvous proxy sends for each of gloo's HTTP requests.
KV_REQUESTS: dict[Op, type[Message]] = {Op.KV_GET: KvGet, Op.KV_PUT: KvPut, Op.KV_DELETE: KvDelete}
