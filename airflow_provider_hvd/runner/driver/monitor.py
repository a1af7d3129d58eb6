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
import time
from dataclasses import dataclass
from typing import Callable

from airflow_provider_hvd.runner.driver.run_failures import RunFailures, is_consequence
from airflow_provider_hvd.runner.driver.service import Event
from airflow_provider_hvd.runner.errors import HorovodRunError
from airflow_provider_hvd.runner.wire.messages import EventKind, RankException, Stalled
from airflow_provider_hvd.runner.wire.hellos import RankHello

log = logging.getLogger("airflow_provider_hvd.runner")

# How long a non-zero exit waits for the same rank's exception report, which
# travels on another connection and may arrive a moment later.
_EXCEPTION_GRACE_S = 2.0
# How long a failure that is only a consequence of another rank's (Horovod shut down
# under a rank because a peer died) waits for the cause to be reported.
_CAUSE_GRACE_S = 2.0
# A Spark job failure usually has a rank-level cause that is reported on its own (a lost
# launcher, mpirun's account of a dead rank); the job error may arrive first, e.g. when an
# executor dies but its Python worker, holding our channel, lingers. Wait this long for it.
_JOB_ERROR_GRACE_S = 1.0
# After the first rank reports a stalled collective, how long to wait for the other
# waiting ranks' reports (they poll once a second), so that the ones that did not report
# are the ranks that never joined.
_STALL_GRACE_S = 2.5


@dataclass
class HeldFailure:
    """A failure held back for ``seconds`` while a report that explains it better may still come."""

    why: str
    seconds: float
    since: float | None = None
    event: Event | None = None

    def hold(self, event: Event | None = None) -> None:
        if self.since is None:
            self.since, self.event = time.monotonic(), event

    @property
    def held(self) -> bool:
        return self.since is not None

    def expired(self) -> bool:
        return self.since is not None and time.monotonic() - self.since > self.seconds


class RunMonitor(RunFailures):
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
        self.stalled: dict[int, Stalled] = {}
        self._first_stall: float | None = None
        self.events = events
        self.start_timeout = start_timeout
        self.where = where
        self.started: dict[int, RankHello] = {}
        self.hosts: dict[int, str] = {}
        self.exited_ok: set[int] = set()
        self.closed: set[int] = set()
        self.exceptions: dict[int, RankException] = {}
        self.result: bytes | None = None
        self.launcher_said: collections.deque[str] = collections.deque(maxlen=15)
        self.t0 = time.monotonic()

    def wait(self, spark_job_error: Callable[[], BaseException | None] = lambda: None) -> bytes | None:
        """Block until the run ends; return rank 0's sealed result, or raise."""
        start_deadline = self.t0 + self.start_timeout
        # A non-zero exit waits for the same rank's exception, which travels on another connection.
        exit_without_reason = HeldFailure("its rank's exception", _EXCEPTION_GRACE_S)
        # A failure that is only a consequence of another rank's waits for the cause.
        consequence = HeldFailure("the failure that caused it", _CAUSE_GRACE_S)
        # A Spark job failure waits for a rank-level cause reported on its own.
        job_failure = HeldFailure("a rank's own account", _JOB_ERROR_GRACE_S)
        explained_error: BaseException | None = None
        while True:
            try:
                event = self.events.get(timeout=0.1)
            except queue.Empty:
                event = None
            if event is not None:
                failure = self._on_event(event)
                if failure is not None:
                    if is_consequence(self.exceptions.get(failure.rank)):
                        consequence.hold(failure)
                    elif self._needs_no_wait(failure):
                        raise self._rank_failure(failure)
                    else:
                        exit_without_reason.hold(failure)
            if exit_without_reason.held:
                held = exit_without_reason.event
                if held.rank in self.exceptions or held.rank in self.closed or exit_without_reason.expired():
                    if not is_consequence(self.exceptions.get(held.rank)):
                        raise self._rank_failure(held)
                    consequence.hold(held)
                    exit_without_reason = HeldFailure("its rank's exception", _EXCEPTION_GRACE_S)
            if consequence.expired():
                raise self._rank_failure(consequence.event)
            if self._first_stall is not None and time.monotonic() - self._first_stall > _STALL_GRACE_S:
                raise self._stall_error()
            if self.timeout is not None and time.monotonic() - self.t0 > self.timeout:
                raise self._timeout_error()
            if len(self.exited_ok) == self.np and 0 in self.closed:
                return self.result
            if len(self.started) < self.np and time.monotonic() > start_deadline:
                raise self._start_timeout_error()
            job_error = spark_job_error()
            if job_error is not None and job_error is not explained_error:
                explained_error = job_error  # Spark's text can run to pages: read it once
                self._raise_if_explained(job_error)
            if job_error is not None and not exit_without_reason.held and not consequence.held:
                job_failure.hold()
                if job_failure.expired():
                    raise self._job_failure(job_error) from job_error

    def _raise_if_explained(self, job_error: BaseException) -> None:
        explained = self.explain_job_error(job_error)
        if explained is not None:
            raise explained from None  # Spark's wrapping adds pages, not information

    def _needs_no_wait(self, failure: Event) -> bool:
        """Whether a failing event already says all there is: anything but an exit, an exit whose rank
        has reported (or closed), and an Open MPI crash (which has no exception to wait for)."""
        return (failure.kind != EventKind.EXITED or failure.rank in self.exceptions or failure.rank in self.closed
                or failure.data.daemon is not None)

    def _on_event(self, event: Event) -> Event | None:
        rank = event.rank
        if event.kind == EventKind.LAUNCHER_STARTED:
            hosts = event.data.hosts  # mpirun's launcher speaks for ranks on every host
            self.hosts[rank] = hosts[rank] if hosts else event.data.host
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
            if event.data.returncode == 0:
                self.exited_ok.add(rank)
            else:
                return event
        elif event.kind == EventKind.LAUNCHER_LOST:
            return event
        elif event.kind == EventKind.LAUNCHER_SAID:
            self.launcher_said.append(event.data.line)
        elif event.kind == EventKind.RETURNED:
            self.returned.add(rank)
        elif event.kind == EventKind.STALLED:
            self.stalled[rank] = event.data
            if self._first_stall is None:
                self._first_stall = time.monotonic()
                log.warning("HorovodRunner: rank %d has waited %.0f s in a collective; collecting the other "
                            "ranks' state", rank, event.data.waiting_s)
        return None
