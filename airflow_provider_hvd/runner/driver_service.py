"""The driver's end of a run: serves the payload, collects logs, results and failures.

Four kinds of peers connect, each with the run's secret (see channel.py):
  - a barrier *task*, once, to learn where every other task is (roster.py);
  - a gloo rank's *rendezvous proxy*, run by its launcher (rendezvous.py);
  - a *launcher* (the barrier task, or a thread of the driver in local mode) that
    started a rank process and reports how it ended, forwarding its output;
  - the *rank* process itself, which fetches the payload, sends
    ``log_to_driver`` messages, its exception if it raises, and (rank 0) its result.
Everything that matters for the run's outcome becomes an ``Event`` on a queue
that ``monitor.RunMonitor`` reads; log lines go straight to the log sink.
"""

from __future__ import annotations

import logging
import queue
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from airflow_provider_hvd.runner.channel import Channel, ChannelClosed, ChannelServer
from airflow_provider_hvd.runner.rendezvous import KeyValueStore
from airflow_provider_hvd.runner.roster import Roster

log = logging.getLogger(__name__)

LogSink = Callable[[int, str, str], None]


@dataclass
class Event:
    # rank_started | rank_closed | launcher_started | launcher_lost | exception | exited | result
    # | returned (the training function returned) | stalled (a collective pending past stall_timeout)
    kind: str
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
        # ("launcher", rank), barrier tasks still serving something by ("task", partition).
        self._peers: dict[tuple[str, int], Channel] = {}
        self._peers_changed = threading.Condition()
        self._server = ChannelServer(secret, self._handle, host=host)
        self.port = self._server.port

    @property
    def refused_connections(self) -> int:
        return self._server.refused

    def _handle(self, channel: Channel, hello: dict[str, Any]) -> None:
        role, rank = hello.get("role"), int(hello.get("rank", -1))
        if role == "task":
            self._serve_task(channel, hello)
            return
        if role == "kv":  # a gloo rank's rendezvous, through its launcher's proxy
            try:
                self.rendezvous.serve(channel)
            except (ChannelClosed, OSError, ValueError):
                pass
            return
        if role == "rank":
            self.events.put(Event("rank_started", rank, hello))
        elif role == "launcher":
            # A gloo launcher starts one rank; mpirun's launcher starts them all.
            ranks = [int(r) for r in hello.get("ranks", [rank])]
            self._hold(("launcher", rank), channel)
            for r in ranks:
                self.events.put(Event("launcher_started", r, hello))
        else:
            log.warning("driver service: unknown peer role %r from %s", role, channel.peer)
            return
        said_bye = False
        try:
            while True:
                message = channel.recv_json()
                op = message.get("op")
                if op == "get_payload":
                    channel.send_bytes(self._payload)
                elif op == "log":
                    stream = message.get("stream", "log")
                    for line in str(message.get("line", "")).splitlines() or [""]:
                        self._log_sink(int(message.get("rank", rank)), stream, line)
                        if stream == "mpirun":  # the monitor quotes mpirun's own words if ranks never start
                            self.events.put(Event("launcher_said", rank, {"line": line}))
                elif op == "diagnostic":  # a launcher's account of a slow start: quoted on failure only
                    self.events.put(Event("launcher_said", rank, {"line": str(message.get("line", ""))}))
                elif op == "result":
                    self.events.put(Event("result", rank, message, channel.recv_bytes()))
                elif op == "timeline":
                    chunk = channel.recv_bytes()
                    if self._on_timeline is not None:
                        self._on_timeline(chunk)
                elif op in ("exception", "exited", "stalled", "returned"):
                    self.events.put(Event(op, int(message.get("rank", rank)), message))
                elif op == "bye":
                    said_bye = True
                    return
        except (ChannelClosed, OSError, ValueError):
            pass
        finally:
            if role == "rank":
                self.events.put(Event("rank_closed", rank, hello))
            else:
                self._release(("launcher", rank), said_bye, hello.get("ranks", [rank]), hello)

    def _serve_task(self, channel: Channel, hello: dict[str, Any]) -> None:
        if self._roster is None:
            log.warning("driver service: a barrier task joined a run that has none, from %s", channel.peer)
            return
        partition = int(hello.get("partition", -1))
        self._hold(("task", partition), channel)
        said_bye = False
        try:
            slots = self._roster.join(channel, partition, dict(hello.get("info") or {}))
            if slots is not None:
                hosts = sorted({s.hostname for s in slots})
                log.info("HorovodRunner: all %d barrier tasks joined in %.1f s, on %s", len(slots),
                         time.monotonic() - self._t0, ", ".join(hosts))
            while True:
                if channel.recv_json().get("op") == "bye":
                    said_bye = True
                    return
        except (ChannelClosed, OSError, ValueError) as exc:
            if isinstance(exc, ValueError):
                log.warning("driver service: %s", exc)
        finally:
            self._release(("task", partition), said_bye, self._roster.ranks_of(partition),
                          {"host": hello.get("info", {}).get("host", "?")})

    def ranks_of_task(self, partition: int) -> list[int]:
        """The ranks barrier task ``partition`` holds (empty in local mode or before the roster completed)."""
        return self._roster.ranks_of(partition) if self._roster else []

    def _hold(self, key: tuple[str, int], channel: Channel) -> None:
        """A peer that holds processes of the run: stop_ranks tells it to stop and waits for it."""
        with self._peers_changed:
            self._peers[key] = channel

    def _release(self, key: tuple[str, int], said_bye: bool, ranks, data: dict[str, Any]) -> None:
        """The peer left. Without "bye", while the run was on, its task or executor died: its ranks are lost."""
        with self._peers_changed:
            self._peers.pop(key, None)
            self._peers_changed.notify_all()
        if not said_bye and not self._closing.is_set():
            for r in ranks:
                self.events.put(Event("launcher_lost", int(r), data))

    def stop_ranks(self, grace: float) -> None:
        """Ask every launcher still connected to kill its rank and report (its last timeline
        chunk included), release the barrier tasks still serving, and wait up to ``grace``
        seconds for all of them to leave."""
        self._closing.set()
        with self._peers_changed:
            channels = list(self._peers.values())
        for channel in channels:
            try:
                channel.send_json({"op": "stop"})
            except OSError:
                pass
        with self._peers_changed:
            self._peers_changed.wait_for(lambda: not self._peers, timeout=grace)

    def close(self) -> None:
        """Close every channel: ranks and launchers treat that as 'stop now'."""
        self._closing.set()
        self._server.close()
        self._server.join(5)
