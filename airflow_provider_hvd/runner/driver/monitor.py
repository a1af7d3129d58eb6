"""Turn driver-service events into progress in the log, rank 0's result, or a clear error.

A run succeeds when every rank's launcher reported exit code 0 and rank 0's
channel has closed (so its result, sent before, has arrived). It fails at the
first of: a rank's exception, a non-zero exit or signal, a launcher that vanished
(its executor died), a Spark job error, ranks that did not start in time, ranks
waiting in a collective past ``stall_timeout`` (stall.py), or the run's ``timeout``.
The first failing rank is the one named; the others die because the run stops.
"""

from __future__ import annotations

import collections
import logging
import queue
import re
import time
from typing import Callable

from airflow_provider_hvd.runner.driver.service import Event
from airflow_provider_hvd.runner.errors import (
    HorovodRunError,
    MpiDaemonCrashError,
    RankFailedError,
    SparkStageError,
    StallError,
    StartTimeoutError,
)
from airflow_provider_hvd.runner.wire.messages import EventKind

log = logging.getLogger("airflow_provider_hvd.runner")

# How long a non-zero exit waits for the same rank's exception report, which
# travels on another connection and may arrive a moment later.
_EXCEPTION_GRACE_S = 2.0
# How long a failure that is only a consequence of another rank's (Horovod shut down
# under a rank because a peer died) waits for the cause to be reported.
_CAUSE_GRACE_S = 2.0
_CONSEQUENCE_TYPES = {"HorovodInternalError"}
# A Spark job failure usually has a rank-level cause that is reported on its own (a lost
# launcher, mpirun's account of a dead rank); the job error may arrive first, e.g. when an
# executor dies but its Python worker, holding our channel, lingers. Wait this long for it.
_JOB_ERROR_GRACE_S = 1.0
_LOST_TASK = re.compile(r"barrier task ResultTask\(\d+, (\d+)\)")
_EXECUTOR_LOST = re.compile(r"ExecutorLostFailure \(executor (\S+) exited[^)]*\)\s*Reason: ([^\n]*)")
# After the first rank reports a stalled collective, how long to wait for the other
# waiting ranks' reports (they poll once a second), so that the ones that did not report
# are the ranks that never joined.
_STALL_GRACE_S = 2.5


def _is_consequence(exc: dict | None) -> bool:
    """A rank whose collective failed because a peer vanished raises HorovodInternalError
    ("Horovod has been shut down"): true, but the peer is the one to name."""
    return bool(exc) and exc.get("type") in _CONSEQUENCE_TYPES


class RunMonitor:
    def __init__(self, np: int, events: queue.Queue, *, start_timeout: float, where: str,
                 stall_timeout: float | None = None, timeout: float | None = None,
                 ranks_of_task: Callable[[int], list[int]] = lambda partition: [],
                 explain_job_error: Callable[[BaseException], HorovodRunError | None] = lambda e: None):
        """``ranks_of_task(partition)``: the ranks a barrier task holds, to name them when Spark
        reports the task's executor lost. ``explain_job_error``: the error a Spark job failure
        stands for when no rank can report it (a worker that cannot run ranks at all), raised
        at once."""
        self.np = np
        self.explain_job_error = explain_job_error
        self.ranks_of_task = ranks_of_task
        self.stall_timeout = stall_timeout
        self.timeout = timeout
        self.returned: set[int] = set()
        self.stalled: dict[int, dict] = {}
        self._first_stall: float | None = None
        self.events = events
        self.start_timeout = start_timeout
        self.where = where
        self.started: dict[int, dict] = {}
        self.hosts: dict[int, str] = {}
        self.exited_ok: set[int] = set()
        self.closed: set[int] = set()
        self.exceptions: dict[int, dict] = {}
        self.result: bytes | None = None
        self.launcher_said: collections.deque[str] = collections.deque(maxlen=15)
        self.t0 = time.monotonic()

    def wait(self, spark_job_error: Callable[[], BaseException | None] = lambda: None) -> bytes | None:
        """Block until the run ends; return rank 0's sealed result, or raise."""
        deadline = self.t0 + self.start_timeout
        pending_exit: tuple[float, Event] | None = None
        consequence: tuple[float, Event] | None = None
        job_failed_at: float | None = None
        explained_error: BaseException | None = None
        while True:
            try:
                event = self.events.get(timeout=0.1)
            except queue.Empty:
                event = None
            if event is not None:
                failure = self._on_event(event)
                if failure is not None:
                    if _is_consequence(self.exceptions.get(failure.rank)):
                        consequence = consequence or (time.monotonic(), failure)
                    elif (event.kind != EventKind.EXITED or event.rank in self.exceptions or event.rank in self.closed
                          or event.data.get("daemon")):  # an Open MPI crash has no exception to wait for
                        raise self._rank_failure(failure)
                    else:
                        pending_exit = pending_exit or (time.monotonic(), failure)
            if pending_exit and (pending_exit[1].rank in self.exceptions or pending_exit[1].rank in self.closed
                                 or time.monotonic() - pending_exit[0] > _EXCEPTION_GRACE_S):
                if not _is_consequence(self.exceptions.get(pending_exit[1].rank)):
                    raise self._rank_failure(pending_exit[1])
                consequence, pending_exit = consequence or (time.monotonic(), pending_exit[1]), None
            if consequence and time.monotonic() - consequence[0] > _CAUSE_GRACE_S:
                raise self._rank_failure(consequence[1])
            if self._first_stall is not None and time.monotonic() - self._first_stall > _STALL_GRACE_S:
                raise self._stall_error()
            if self.timeout is not None and time.monotonic() - self.t0 > self.timeout:
                raise self._timeout_error()
            if len(self.exited_ok) == self.np and 0 in self.closed:
                return self.result
            if len(self.started) < self.np and time.monotonic() > deadline:
                raise self._start_timeout_error()
            job_error = spark_job_error()
            if job_error is not None and job_error is not explained_error:
                explained_error = job_error  # Spark's text can run to pages: read it once
                explained = self.explain_job_error(job_error)
                if explained is not None:
                    raise explained from None  # Spark's wrapping adds pages, not information
            if job_error is not None and pending_exit is None and consequence is None:
                job_failed_at = job_failed_at or time.monotonic()
                if time.monotonic() - job_failed_at > _JOB_ERROR_GRACE_S:
                    raise self._job_failure(job_error) from job_error

    def _on_event(self, event: Event) -> Event | None:
        rank = event.rank
        if event.kind == EventKind.LAUNCHER_STARTED:
            hosts = event.data.get("hosts")  # mpirun's launcher speaks for ranks on every host
            self.hosts[rank] = hosts[rank] if hosts else event.data.get("host", "?")
        elif event.kind == EventKind.RANK_STARTED:
            self.started[rank] = event.data
            if len(self.started) == self.np:
                log.info("HorovodRunner: all %d ranks started in %.1f s", self.np, time.monotonic() - self.t0)
        elif event.kind == EventKind.RANK_CLOSED:
            self.closed.add(rank)
        elif event.kind == EventKind.RESULT:
            self.result = event.blob
            log.info("HorovodRunner: rank 0 returned its result (%d bytes)", len(event.blob))
        elif event.kind == EventKind.EXCEPTION:
            self.exceptions[rank] = event.data
            return event
        elif event.kind == EventKind.EXITED:
            if event.data.get("returncode") == 0:
                self.exited_ok.add(rank)
            else:
                return event
        elif event.kind == EventKind.LAUNCHER_LOST:
            return event
        elif event.kind == EventKind.LAUNCHER_SAID:
            self.launcher_said.append(event.data.get("line", ""))
        elif event.kind == EventKind.RETURNED:
            self.returned.add(rank)
        elif event.kind == EventKind.STALLED:
            self.stalled[rank] = event.data
            if self._first_stall is None:
                self._first_stall = time.monotonic()
                log.warning("HorovodRunner: rank %d has waited %.0f s in a collective; collecting the other "
                            "ranks' state", rank, event.data.get("waiting_s", 0))
        return None

    def _start_timeout_error(self) -> StartTimeoutError:
        missing = sorted(set(range(self.np)) - set(self.started))
        launched = sorted(r for r in missing if r in self.hosts)
        message = (f"HorovodRunner: rank(s) {missing} did not start within start_timeout="
                   f"{self.start_timeout:g}s ({len(self.started)} of {self.np} started, {self.where}). ")
        if launched:
            # Their launcher is up, so Spark scheduled the tasks: the processes hung while starting.
            where = ", ".join(f"rank {r} on {self.hosts[r]}" for r in launched)
            message += (f"Their launchers were running ({where}) but the rank processes never connected: "
                        "they hung while starting (imports, or mpirun unable to reach its daemons); check "
                        "the executors' logs, or raise start_timeout if imports are slow there.")
        else:
            message += ("Their Spark tasks never started a launcher: they were not scheduled, or hung "
                        "before launching; check the Spark UI and the executors' logs.")
        if self.launcher_said:
            message += "\n--- mpirun's last lines, and its launcher's snapshots of its processes ---\n" + "\n".join(self.launcher_said)
        return StartTimeoutError(message, missing_ranks=missing)

    def _job_failure(self, job_error: BaseException) -> HorovodRunError:
        """The Spark stage failed and no rank said why. A lost executor is named by its ranks."""
        text = str(job_error)
        task, lost = _LOST_TASK.search(text), _EXECUTOR_LOST.search(text)
        ranks = self.ranks_of_task(int(task.group(1))) if task and lost else []
        unfinished = [r for r in ranks if r not in self.exited_ok]
        if not unfinished:
            return SparkStageError(f"HorovodRunner: the Spark barrier stage failed before the ranks finished "
                                   f"({len(self.exited_ok)} of {self.np} done): {_first_line(job_error)}",
                                   executor_lost=bool(lost) or "ExecutorLostFailure" in text)
        rank = unfinished[0]
        host = self.hosts.get(rank, "?")
        pid = (self.started.get(rank) or {}).get("pid")
        reason = lost.group(2).strip()
        message = (f"HorovodRunner: lost rank {rank} (host {host}" + (f", pid {pid})" if pid else ")")
                   + f": its Spark executor {lost.group(1)} died ({reason})"
                   + (f", taking rank(s) {unfinished}" if len(unfinished) > 1 else "") + ".")
        if "137" in reason:
            message += " Exit code 137 is SIGKILL: the kernel's out-of-memory killer, a container limit or `kill -9`."
        message += " Check that executor's log."
        return RankFailedError(message, rank=rank, host=host, returncode=None, tail=[], kind="lost")

    def _daemon_crash(self, event: Event, daemon: dict) -> MpiDaemonCrashError:
        host = str(daemon.get("host", "?"))
        signal = str(daemon.get("signal", "?"))
        process = str(daemon.get("process", "orted"))
        ranks = sorted(r for r, h in self.hosts.items() if h == host) or [event.rank]
        tail = event.data.get("tail", [])
        message = _daemon_crash_message(process, host, signal, ranks)
        if tail:
            message += "\n--- Open MPI's last lines ---\n" + "\n".join(tail)
        return MpiDaemonCrashError(message, process=process, signal=signal, rank=ranks[0], host=host,
                                   returncode=event.data.get("returncode"), tail=tail)

    def _unfinished(self) -> list[int]:
        return [r for r in range(self.np) if r not in self.returned and r not in self.exited_ok]

    def _stall_error(self) -> StallError:
        waiting = sorted(self.stalled)
        stalled = [r for r in self._unfinished() if r not in self.stalled]
        longest = max(d.get("waiting_s", 0) for d in self.stalled.values())
        where = ", ".join(f"rank {r} (host {self.hosts.get(r, '?')})" for r in stalled)
        if stalled:
            message = (f"HorovodRunner: {where} stopped taking part in collectives: rank(s) {waiting} waited "
                       f"{longest:.0f} s (stall_timeout={self.stall_timeout:g}s) in a collective that rank(s) "
                       f"{stalled} never submitted. A rank that hangs (a deadlock, an endless loop, a blocking "
                       "read) or skips a collective the others make (a branch on hvd.rank(), uneven numbers of "
                       "batches per rank) does this; the stalled rank's last output is above in the log.")
        else:
            message = (f"HorovodRunner: every unfinished rank ({waiting}) waited {longest:.0f} s "
                       f"(stall_timeout={self.stall_timeout:g}s) in a collective the others did not match: "
                       "the ranks submit collectives with different names, shapes or order (e.g. a "
                       "rank-dependent branch around an allreduce).")
        if self.returned:
            message += f" Rank(s) {sorted(self.returned)} had already returned from the training function."
        return StallError(message, stalled_ranks=stalled, waiting_ranks=waiting)

    def _timeout_error(self) -> StallError:
        late = self._unfinished()
        message = (f"HorovodRunner: the run exceeded timeout={self.timeout:g}s; rank(s) {late} had not "
                   "returned from the training function")
        if self.returned:
            message += f" (rank(s) {sorted(self.returned)} had)"
        return StallError(message + ". Raise timeout if training needs longer.",
                          stalled_ranks=late, waiting_ranks=sorted(self.stalled))

    def _rank_failure(self, event: Event) -> RankFailedError:
        rank = event.rank
        host = self.hosts.get(rank) or event.data.get("host") or "?"
        pid = (self.started.get(rank) or {}).get("pid") or event.data.get("pid")
        who = f"rank {rank} (host {host}" + (f", pid {pid})" if pid else ")")
        exc = self.exceptions.get(rank)
        if event.kind == EventKind.EXITED and event.data.get("daemon") and exc is None:
            return self._daemon_crash(event, event.data["daemon"])
        tail = event.data.get("tail", []) if event.kind == EventKind.EXITED else []
        returncode = event.data.get("returncode") if event.kind == EventKind.EXITED else None
        if exc is not None:
            stage = " while loading the training function" if exc.get("while_loading") else ""
            message = f"HorovodRunner: {who} failed{stage}: {exc['type']}: {exc['message']}"
            if exc.get("hint"):
                message += f"\nHint: {exc['hint']}"
            message += f"\n--- traceback of rank {rank} ---\n{exc['traceback'].rstrip()}"
            return RankFailedError(message, rank=rank, host=host, exc_type=exc["type"],
                                   traceback=exc["traceback"], returncode=returncode, tail=tail,
                                   kind="peer_lost" if _is_consequence(exc) else "exception")
        kind, signal = "exit", event.data.get("signal")
        if event.kind == EventKind.LAUNCHER_LOST and event.data.get("unreachable"):
            kind = "unreachable"
            hostname = event.data.get("hostname")
            named = f"{hostname} ({host})" if hostname and hostname != host else host
            message = (f"HorovodRunner: host {named}, where rank {rank} runs, stopped answering: the driver's "
                       "connection to its Spark task timed out (its network is down, or the host is). Not "
                       "restarted: Spark still counts that host's executors until spark.network.timeout. Check "
                       f"{named}'s network; a retry of the task starts the run anew.")
        elif event.kind == EventKind.LAUNCHER_LOST:
            kind = "lost"
            message = (f"HorovodRunner: lost contact with {who}'s launcher: its Spark task or executor "
                       "died. Check the executor's log for an out-of-memory kill or a lost worker.")
        elif signal:
            kind = "signal"
            message = f"HorovodRunner: {who} was killed by signal {event.data['signal']}"
            if event.data["signal"] == "SIGKILL":
                message += " (the kernel's out-of-memory killer does this, and so does `kill -9`)"
        else:
            message = f"HorovodRunner: {who} exited with code {returncode} without raising a Python exception"
        if tail:
            message += f"\n--- last {len(tail)} lines of rank {rank}'s output ---\n" + "\n".join(tail)
        return RankFailedError(message, rank=rank, host=host, returncode=returncode, tail=tail, kind=kind,
                               signal=signal)


def _daemon_crash_message(process: str, host: str, signal: str, ranks: list[int]) -> str:
    if process == "orted":
        which = f"the Open MPI daemon (orted) that mpirun started on host {host}"
    else:
        which = f"mpirun itself (on host {host})"
    return (f"HorovodRunner: {which} crashed with {signal}, taking rank(s) {ranks}: Open MPI failed, not the "
            "training function. Running it again usually succeeds; if it recurs, report it with Open MPI's "
            "own lines, kept below.")


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    for line in text.splitlines():
        if "Exception" in line or "Error" in line:
            return line.strip()[:2000]
    return text.splitlines()[0][:2000] if text else type(exc).__name__
