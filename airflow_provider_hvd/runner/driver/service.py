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
from dataclasses import dataclass, field
from typing import Any, Callable

from airflow_provider_hvd.runner.driver.kv_store import KeyValueStore
from airflow_provider_hvd.runner.driver.roster import Roster
from airflow_provider_hvd.runner.wire.channel import Channel, ChannelClosed, ChannelServer, is_unreachable
from airflow_provider_hvd.runner.wire.messages import EventKind, Op, Role, Stream

log = logging.getLogger(__name__)

LogSink = Callable[[int, str, str], None]

# Reports from ranks and launchers that the monitor reads as they are.
_REPORTED = {Op.EXCEPTION: EventKind.EXCEPTION, Op.EXITED: EventKind.EXITED, Op.STALLED: EventKind.STALLED,
             Op.RETURNED: EventKind.RETURNED}


@dataclass
class Event:
    kind: EventKind
    rank: int
    data: dict[str, Any] = field(default_factory=dict)
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

    def _handle(self, channel: Channel, hello: dict[str, Any]) -> None:
        try:
            role, rank = Role(hello.get("role")), int(hello.get("rank", -1))
        except ValueError:
            log.warning("driver service: unknown peer role %r from %s", hello.get("role"), channel.peer)
            return
        if role == Role.TASK:
            self._serve_task(channel, hello)
            return
        if role == Role.KV:  # a gloo rank's rendezvous, through its launcher's proxy
            try:
                self.rendezvous.serve(channel)
            except (ChannelClosed, OSError, ValueError):
                pass
            return
        if role == Role.RANK:
            self.events.put(Event(EventKind.RANK_STARTED, rank, hello))
        elif role == Role.LAUNCHER:
            # A gloo launcher starts one rank; mpirun's launcher starts them all.
            ranks = [int(r) for r in hello.get("ranks", [rank])]
            self._hold((Role.LAUNCHER, rank), channel)
            for r in ranks:
                self.events.put(Event(EventKind.LAUNCHER_STARTED, r, hello))
        else:
            log.warning("driver service: a %s peer cannot talk to the driver, from %s", role, channel.peer)
            return
        said_bye, unreachable = False, False
        try:
            while True:
                message = channel.recv_json()
                op = Op(message.get("op"))
                if op == Op.GET_PAYLOAD:
                    channel.send_bytes(self._payload)
                elif op == Op.LOG:
                    stream = message.get("stream", Stream.LOG)
                    for line in str(message.get("line", "")).splitlines() or [""]:
                        self._log_sink(int(message.get("rank", rank)), stream, line)
                        if stream == Stream.MPIRUN:  # the monitor quotes mpirun's own words if ranks never start
                            self.events.put(Event(EventKind.LAUNCHER_SAID, rank, {"line": line}))
                elif op == Op.DIAGNOSTIC:  # a launcher's account of a slow start: quoted on failure only
                    self.events.put(Event(EventKind.LAUNCHER_SAID, rank, {"line": str(message.get("line", ""))}))
                elif op == Op.RESULT:
                    self.events.put(Event(EventKind.RESULT, rank, message, channel.recv_bytes()))
                elif op == Op.TIMELINE:
                    chunk = channel.recv_bytes()
                    if self._on_timeline is not None:
                        self._on_timeline(chunk)
                elif op in _REPORTED:
                    self.events.put(Event(_REPORTED[op], int(message.get("rank", rank)), message))
                elif op == Op.BYE:
                    said_bye = True
                    return
                else:
                    raise ValueError(f"{role} {rank} sent {op!r}, which only other peers send")
        except (ChannelClosed, OSError, ValueError) as exc:
            if isinstance(exc, ValueError):  # an unknown or misplaced op: a bug, say so
                log.warning("driver service: dropped %s %d (%s): %s", role, rank, channel.peer, exc)
            unreachable = is_unreachable(exc)
        finally:
            if unreachable:
                self._mark_unreachable(channel, hello.get("hostname"))
            if role == Role.RANK:
                self.events.put(Event(EventKind.RANK_CLOSED, rank, hello))
            else:
                self._release((Role.LAUNCHER, rank), said_bye, hello.get("ranks", [rank]),
                              {**hello, "unreachable": unreachable})

    def _serve_task(self, channel: Channel, hello: dict[str, Any]) -> None:
        if self._roster is None:
            log.warning("driver service: a barrier task joined a run that has none, from %s", channel.peer)
            return
        partition = int(hello.get("partition", -1))
        self._hold((Role.TASK, partition), channel)
        said_bye, unreachable = False, False
        try:
            slots = self._roster.join(channel, partition, dict(hello.get("info") or {}))
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
            info = hello.get("info") or {}
            if unreachable:
                self._mark_unreachable(channel, info.get("hostname"))
            self._release((Role.TASK, partition), said_bye, self._roster.ranks_of(partition),
                          {"host": info.get("host", "?"), "hostname": info.get("hostname"),
                           "unreachable": unreachable})

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

    def _release(self, key: tuple[Role, int], said_bye: bool, ranks, data: dict[str, Any]) -> None:
        """The peer left. Without "bye", while the run was on, its task or executor died: its ranks are lost."""
        with self._peers_changed:
            self._peers.pop(key, None)
            self._peers_changed.notify_all()
        if not said_bye and not self._closing.is_set():
            for r in ranks:
                self.events.put(Event(EventKind.LAUNCHER_LOST, int(r), data))

    def stop_ranks(self, grace: float) -> None:
        """Ask every launcher still connected to kill its rank and report (its last timeline
        chunk included) and wait for them to leave; then release the barrier tasks still
        serving and wait for those; ``grace`` seconds for both.

        Launchers first: mpirun ends its job through the orteds that the tasks' rsh services
        hold. Releasing the tasks at the same moment killed those daemons in the middle of
        mpirun's own abort, and Open MPI 4.1's mpirun then crashed in PMIx_Finalize ("abort is
        already in progress"; 3 of 30 runs of the stress test in a clean-clone run)."""
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
                    channel.send_json({"op": Op.STOP})
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
