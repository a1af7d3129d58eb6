"""The errors a run ends with, in words: which rank, on which host, what it said, and what to do.

RunFailures is the half of RunMonitor (monitor.py) that turns what the monitor gathered (the ranks'
hosts, hellos, exceptions, exits, stall reports) into the error ``run()`` raises.
"""

from __future__ import annotations

import re
from typing import Any

from airflow_provider_hvd.runner.driver.service import Event
from airflow_provider_hvd.runner.errors import (
    HorovodRunError,
    MpiDaemonCrashError,
    RankFailedError,
    SparkStageError,
    StallError,
    StartTimeoutError,
)
from airflow_provider_hvd.runner.wire.messages import DaemonDeath, EventKind, Exited, Lost, RankException, Stalled
from airflow_provider_hvd.runner.wire.hellos import RankHello

CONSEQUENCE_TYPES = {"HorovodInternalError"}
_LOST_TASK = re.compile(r"barrier task ResultTask\(\d+, (\d+)\)")
_EXECUTOR_LOST = re.compile(r"ExecutorLostFailure \(executor (\S+) exited[^)]*\)\s*Reason: ([^\n]*)")


def is_consequence(exc: RankException | None) -> bool:
    """A rank whose collective failed because a peer vanished raises HorovodInternalError
    ("Horovod has been shut down"): true, but the peer is the one to name."""
    return exc is not None and exc.type in CONSEQUENCE_TYPES


class RunFailures:
    """What RunMonitor knows of the run, and the errors made from it."""

    np: int
    start_timeout: float
    stall_timeout: float | None
    timeout: float | None
    where: str
    started: dict[int, RankHello]
    hosts: dict[int, str]
    exited_ok: set[int]
    returned: set[int]
    stalled: dict[int, Stalled]
    exceptions: dict[int, RankException]
    launcher_said: Any

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
        pid = getattr(self.started.get(rank), "pid", None)
        reason = lost.group(2).strip()
        message = (f"HorovodRunner: lost rank {rank} (host {host}" + (f", pid {pid})" if pid else ")")
                   + f": its Spark executor {lost.group(1)} died ({reason})"
                   + (f", taking rank(s) {unfinished}" if len(unfinished) > 1 else "") + ".")
        if "137" in reason:
            message += " Exit code 137 is SIGKILL: the kernel's out-of-memory killer, a container limit or `kill -9`."
        message += " Check that executor's log."
        return RankFailedError(message, rank=rank, host=host, returncode=None, tail=[], kind="lost")

    def _daemon_crash(self, event: Event, daemon: DaemonDeath) -> MpiDaemonCrashError:
        host, signal, process = daemon.host, daemon.signal, daemon.process
        ranks = sorted(r for r, h in self.hosts.items() if h == host) or [event.rank]
        tail = event.data.tail
        message = _daemon_crash_message(process, host, signal, ranks)
        if tail:
            message += "\n--- Open MPI's last lines ---\n" + "\n".join(tail)
        return MpiDaemonCrashError(message, process=process, signal=signal, rank=ranks[0], host=host,
                                   returncode=event.data.returncode, tail=tail)

    def _unfinished(self) -> list[int]:
        return [r for r in range(self.np) if r not in self.returned and r not in self.exited_ok]

    def _stall_error(self) -> StallError:
        waiting = sorted(self.stalled)
        stalled = [r for r in self._unfinished() if r not in self.stalled]
        longest = max(report.waiting_s for report in self.stalled.values())
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
        host = self.hosts.get(rank) or getattr(event.data, "host", None) or "?"
        pid = getattr(self.started.get(rank), "pid", None) or getattr(event.data, "pid", None)
        who = f"rank {rank} (host {host}" + (f", pid {pid})" if pid else ")")
        exc = self.exceptions.get(rank)
        exited = event.data if event.kind == EventKind.EXITED else Exited()
        if exited.daemon is not None and exc is None:
            return self._daemon_crash(event, exited.daemon)
        if exc is not None:
            return self._exception_failure(rank, host, who, exc, exited)
        if event.kind == EventKind.LAUNCHER_LOST:
            return self._lost_failure(rank, host, who, event.data)
        kind, signal, returncode, tail = "exit", exited.signal, exited.returncode, exited.tail
        if signal:
            kind = "signal"
            message = f"HorovodRunner: {who} was killed by signal {signal}"
            if signal == "SIGKILL":
                message += " (the kernel's out-of-memory killer does this, and so does `kill -9`)"
        else:
            message = f"HorovodRunner: {who} exited with code {returncode} without raising a Python exception"
        if tail:
            message += f"\n--- last {len(tail)} lines of rank {rank}'s output ---\n" + "\n".join(tail)
        return RankFailedError(message, rank=rank, host=host, returncode=returncode, tail=tail, kind=kind,
                               signal=signal)

    @staticmethod
    def _exception_failure(rank: int, host: str, who: str, exc: RankException, exited: Exited) -> RankFailedError:
        stage = " while loading the training function" if exc.while_loading else ""
        message = f"HorovodRunner: {who} failed{stage}: {exc.type}: {exc.message}"
        if exc.hint:
            message += f"\nHint: {exc.hint}"
        message += f"\n--- traceback of rank {rank} ---\n{exc.traceback.rstrip()}"
        return RankFailedError(message, rank=rank, host=host, exc_type=exc.type, traceback=exc.traceback,
                               returncode=exited.returncode, tail=exited.tail,
                               kind="peer_lost" if is_consequence(exc) else "exception")

    @staticmethod
    def _lost_failure(rank: int, host: str, who: str, lost: Lost) -> RankFailedError:
        if lost.unreachable:
            named = f"{lost.hostname} ({host})" if lost.hostname and lost.hostname != host else host
            message = (f"HorovodRunner: host {named}, where rank {rank} runs, stopped answering: the driver's "
                       "connection to its Spark task timed out (its network is down, or the host is). Not "
                       "restarted: Spark still counts that host's executors until spark.network.timeout. Check "
                       f"{named}'s network; a retry of the task starts the run anew.")
            return RankFailedError(message, rank=rank, host=host, returncode=None, tail=[], kind="unreachable")
        message = (f"HorovodRunner: lost contact with {who}'s launcher: its Spark task or executor "
                   "died. Check the executor's log for an out-of-memory kill or a lost worker.")
        return RankFailedError(message, rank=rank, host=host, returncode=None, tail=[], kind="lost")


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
