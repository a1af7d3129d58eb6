"""The driver's end of a run: serves the payload, collects logs, results and failures.

Four kinds of peers connect, each with the run's secret (see channel.py):
  - a barrier *task*, once, to learn where every other task is (roster.py);
  - a gloo rank's *rendezvous proxy*, run by its launcher (barrier/rendezvous_proxy.py), served by
    the key-value store (kv_store.py);
  - a *launcher* (the barrier task, or a thread of the driver in local mode) that
    started a rank process and reports how it ended, forwarding its output;
  - the *rank* process itself, which fetches the payload, sends
    ``log_to_driver`` messages, its exception if it raises, and (rank 0) its result.
Everything that matters for the run's outcome becomes an ``Event`` on a queue
that ``monitor.RunMonitor`` reads; log lines go straight to the log sink. The roles,
ops and event kinds are declared in wire/messages.py.
"""

from __future__ import annotations

import logging
import queue
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

from airflow_provider_hvd.runner.driver.kv_store import KeyValueStore
from airflow_provider_hvd.runner.driver.roster import Roster
from airflow_provider_hvd.runner.wire.channel import Channel, ChannelClosed, ChannelServer
from airflow_provider_hvd.runner.wire.keepalive import is_unreachable
from airflow_provider_hvd.runner.wire.messages import (
    Bye,
    Diagnostic,
    EventKind,
    Exited,
    GetPayload,
    Log,
    Lost,
    Message,
    Op,
    RankException,
    Result,
    Returned,
    Role,
    Stalled,
    Stop,
    Stream,
    Timeline,
)
from airflow_provider_hvd.runner.wire.hellos import KvHello, LauncherHello, RankHello, TaskHello, parse_hello

log = logging.getLogger(__name__)

LogSink = Callable[[int, str, str], None]

# Reports from ranks and launchers that the monitor reads as they are.
_REPORTED = {RankException: EventKind.EXCEPTION, Exited: EventKind.EXITED, Stalled: EventKind.STALLED,
             Returned: EventKind.RETURNED}


@dataclass
class Event:
    """``data``: the declared message or hello it came from (wire/messages.py), or ``Lost``."""

    kind: EventKind
    rank: int
    data: Any = None
    blob: bytes | None = None


def print_log_sink(stream=None) -> LogSink:
    """Write each rank line as ``[rank]<stream>: line`` (horovodrun's format), whole lines only."""
    lock = threading.Lock()

    def sink(rank: int, source: str, line: str) -> None:
        out = stream or sys.stdout
        with lock:
            out.write(f"[{rank}]<{source}>: {line}\n")
            out.flush()

    return sink


class DriverService:
    def __init__(self, secret: bytes, payload: bytes, log_sink: LogSink, host: str = "0.0.0.0",
                 on_timeline: Callable[[bytes], None] | None = None, tasks: int = 0):
        """``tasks``: the number of barrier tasks that will join the roster (0 in local mode)."""
        self._payload = payload
        self._roster = Roster(tasks) if tasks else None
        self.rendezvous = KeyValueStore()
        self._t0 = time.monotonic()
        self._log_sink = log_sink
        self._on_timeline = on_timeline
        self.events: queue.Queue[Event] = queue.Queue()
        self._closing = threading.Event()
        # Peers that hold processes of the run and must be told to stop: launchers by
        # (Role.LAUNCHER, rank), barrier tasks still serving something by (Role.TASK, partition).
        self._peers: dict[tuple[Role, int], Channel] = {}
        self._peers_changed = threading.Condition()
        self._unreachable: set[str] = set()  # addresses of hosts whose connections timed out
        self._server = ChannelServer(secret, self._handle, host=host)
        self.port = self._server.port

    @property
    def refused_connections(self) -> int:
        return self._server.refused

    def _handle(self, channel: Channel, hello_frame: dict[str, Any]) -> None:
        try:
            hello = parse_hello(hello_frame)
        except ValueError as exc:
            log.warning("driver service: a peer from %s that is none of ours: %s", channel.peer, exc)
            return
        if isinstance(hello, TaskHello):
            self._serve_task(channel, hello)
        elif isinstance(hello, KvHello):  # a gloo rank's rendezvous, through its launcher's proxy
            try:
                self.rendezvous.serve(channel)
            except (ChannelClosed, OSError, ValueError):
                pass
        elif isinstance(hello, RankHello):
            self.events.put(Event(EventKind.RANK_STARTED, hello.rank, hello))
            self._serve_reports(channel, hello, hello.rank)
        elif isinstance(hello, LauncherHello):
            # A gloo launcher starts one rank; mpirun's launcher starts them all.
            self._hold((Role.LAUNCHER, hello.rank), channel)
            for r in hello.ranks or [hello.rank]:
                self.events.put(Event(EventKind.LAUNCHER_STARTED, int(r), hello))
            self._serve_reports(channel, hello, hello.rank)
        else:
            log.warning("driver service: a %s peer cannot talk to the driver, from %s", hello.role, channel.peer)

    def _serve_reports(self, channel: Channel, hello: RankHello | LauncherHello, rank: int) -> None:
        """A rank's or a launcher's messages, until it says bye or is gone."""
        said_bye, unreachable = False, False
        try:
            while not said_bye:
                said_bye = self._on_message(channel, hello, rank, channel.recv_message())
        except (ChannelClosed, OSError, ValueError) as exc:
            if isinstance(exc, ValueError):  # an unknown or misplaced op: a bug, say so
                log.warning("driver service: dropped %s %d (%s): %s", hello.role, rank, channel.peer, exc)
            unreachable = is_unreachable(exc)
        finally:
            hostname = getattr(hello, "hostname", None)
            if unreachable:
                self._mark_unreachable(channel, hostname)
            if isinstance(hello, RankHello):
                self.events.put(Event(EventKind.RANK_CLOSED, rank, hello))
            else:
                self._release((Role.LAUNCHER, rank), said_bye, hello.ranks or [rank],
                              Lost(host=hello.host, hostname=hostname, pid=hello.pid, unreachable=unreachable))

    def _on_message(self, channel: Channel, hello: RankHello | LauncherHello, rank: int, message: Message) -> bool:
        """One message from a rank or launcher; True once it said bye."""
        if isinstance(message, GetPayload):
            channel.send_bytes(self._payload)
        elif isinstance(message, Log):
            for line in message.line.splitlines() or [""]:
                self._log_sink(rank if message.rank is None else int(message.rank), message.stream, line)
                if message.stream == Stream.MPIRUN:  # the monitor quotes mpirun's own words if ranks never start
                    self.events.put(Event(EventKind.LAUNCHER_SAID, rank, Diagnostic(line=line)))
        elif isinstance(message, Diagnostic):  # a launcher's account of a slow start: quoted on failure only
            self.events.put(Event(EventKind.LAUNCHER_SAID, rank, message))
        elif isinstance(message, Result):
            self.events.put(Event(EventKind.RESULT, rank, message, channel.recv_bytes()))
        elif isinstance(message, Timeline):
            chunk = channel.recv_bytes()
            if self._on_timeline is not None:
                self._on_timeline(chunk)
        elif type(message) in _REPORTED:
            reported = rank if message.rank is None else int(message.rank)
            self.events.put(Event(_REPORTED[type(message)], reported, message))
        elif isinstance(message, Bye):
            return True
        else:
            raise ValueError(f"{hello.role} {rank} sent {message.op!r}, which only other peers send")
        return False

    def _serve_task(self, channel: Channel, hello: TaskHello) -> None:
        if self._roster is None:
            log.warning("driver service: a barrier task joined a run that has none, from %s", channel.peer)
            return
        partition, info = hello.partition, hello.info
        self._hold((Role.TASK, partition), channel)
        said_bye, unreachable = False, False
        try:
            slots = self._roster.join(channel, partition, info)
            if slots is not None:
                hosts = sorted({s.hostname for s in slots})
                log.info("HorovodRunner: all %d barrier tasks joined in %.1f s, on %s", len(slots),
                         time.monotonic() - self._t0, ", ".join(hosts))
            said_bye = channel.read_until(Op.BYE)
            unreachable = channel.ended_by is not None and is_unreachable(channel.ended_by)
        except (ChannelClosed, OSError, ValueError) as exc:
            if isinstance(exc, ValueError):
                log.warning("driver service: %s", exc)
            unreachable = is_unreachable(exc)
        finally:
            if unreachable:
                self._mark_unreachable(channel, info.hostname)
            self._release((Role.TASK, partition), said_bye, self._roster.ranks_of(partition),
                          Lost(host=info.host, hostname=info.hostname, unreachable=unreachable))

    def _mark_unreachable(self, channel: Channel, hostname: str | None) -> None:
        address = channel.peer.rsplit(":", 1)[0]
        if address not in self._unreachable:
            self._unreachable.add(address)
            log.warning("HorovodRunner: the connection to %s%s timed out: that host stopped answering", address,
                        f" ({hostname})" if hostname else "")

    def ranks_of_task(self, partition: int) -> list[int]:
        """The ranks barrier task ``partition`` holds (empty in local mode or before the roster completed)."""
        return self._roster.ranks_of(partition) if self._roster else []

    def _hold(self, key: tuple[Role, int], channel: Channel) -> None:
        """A peer that holds processes of the run: stop_ranks tells it to stop and waits for it."""
        with self._peers_changed:
            self._peers[key] = channel

    def _release(self, key: tuple[Role, int], said_bye: bool, ranks, lost: Lost) -> None:
        """The peer left. Without "bye", while the run was on, its task or executor died: its ranks are lost."""
        with self._peers_changed:
            self._peers.pop(key, None)
            self._peers_changed.notify_all()
        if not said_bye and not self._closing.is_set():
            for r in ranks:
                self.events.put(Event(EventKind.LAUNCHER_LOST, int(r), lost))

    def stop_ranks(self, grace: float) -> None:
        """Ask every launcher still connected to kill its rank and report (its last timeline
        chunk included) and wait for them to leave; then release the barrier tasks still
        serving and wait for those; ``grace`` seconds for both.

        Launchers first: mpirun ends its job through the orteds that the tasks' rsh services
        hold. Releasing the tasks at the same moment kills those daemons in the middle of
        mpirun's own abort, and Open MPI 4.1's mpirun then crashes in PMIx_Finalize ("abort is
        already in progress")."""
        self._closing.set()
        if self._unreachable:
            # A host stopped answering: mpirun's abort waits on its daemon there for ever, and the
            # run has its error already. What does not leave in a second dies with its Spark task.
            grace = min(grace, 1.0)
        deadline = time.monotonic() + grace
        for role in (Role.LAUNCHER, Role.TASK):
            with self._peers_changed:
                channels = [channel for (who, _), channel in self._peers.items() if who == role]
            for channel in channels:
                if channel.peer.rsplit(":", 1)[0] in self._unreachable:
                    channel.close()  # its host stopped answering: a stop would only wait out the grace
                    continue
                try:
                    channel.send_message(Stop())
                except OSError:
                    pass
            with self._peers_changed:
                self._peers_changed.wait_for(lambda: not any(who == role for who, _ in self._peers),
                                             timeout=max(0.0, deadline - time.monotonic()))

    def close(self) -> None:
        """Close every channel: ranks and launchers treat that as 'stop now'."""
        self._closing.set()
        self._server.close()
        self._server.join(5)
