"""``HorovodRunner``: run one Python training function as Horovod ranks, return rank 0's value."""

from __future__ import annotations

import contextlib
import logging
import os
import time
import uuid
from typing import Any, Callable, Iterator

import cloudpickle

from airflow_provider_hvd.runner import defaults
from airflow_provider_hvd.runner.checkpoint import (
    CHECKPOINT_DIR_ENV,
    RESTART_ENV,
    RESUME_FROM_ENV,
    RESUME_IS_RESTART_ENV,
    RUN_ID_ENV,
)
from airflow_provider_hvd.runner.driver.dependencies import required_modules
from airflow_provider_hvd.runner.driver.launcher_choice import resolve_launcher
from airflow_provider_hvd.runner.driver.monitor import RunMonitor
from airflow_provider_hvd.runner.driver.restart_policy import restart_cause
from airflow_provider_hvd.runner.driver.run_checkpoints import RunCheckpoints
from airflow_provider_hvd.runner.driver.service import DriverService, LogSink, print_log_sink
from airflow_provider_hvd.runner.driver.timeline_publisher import TimelinePublisher, attempt_location
from airflow_provider_hvd.runner.errors import HorovodRunError
from airflow_provider_hvd.runner.wire import payload
from airflow_provider_hvd.runner.wire.launch import LaunchEnv, TaskSpec

log = logging.getLogger("airflow_provider_hvd.runner")


class HorovodRunner:
    __doc__ = f"""Run ``main(**kwargs)`` as ``np`` Horovod ranks and return rank 0's return value.

    :param np: ``np > 0``: one Spark barrier stage of ``np`` tasks, one rank per task slot, on the
        active SparkSession or SparkContext (or ``spark``). ``np < 0``: ``-np`` ranks as subprocesses
        of the driver, no Spark job, for debugging.
    :param env: extra environment variables for every rank.
    :param spark: a SparkSession or SparkContext to use instead of the active one.
    :param log_sink: ``callable(rank, stream, line)`` receiving rank output; default: printed on stdout.
    :param timeline: where to deliver rank 0's Horovod Timeline (a path or an fsspec URL, as seen from
        the driver; default ``HOROVOD_TIMELINE`` from ``env`` or the driver's environment): the complete
        file once, when training ends; a live view of the most recent events beside it while it runs.
    :param checkpoint_dir: the run's checkpoint folder (path or fsspec URL, the same for the driver and
        the ranks; default ``HVD_CHECKPOINT_DIR`` in ``env``): ranks read it with ``checkpoint_dir()``,
        restarts resume from the newest checkpoint written there.

    The run's options (runner/defaults.py, README.md's table; ``None`` lifts a limit):

{defaults.param_doc("    ")}
    """

    def __init__(self, *, np: int, driver_log_verbosity: str = defaults.default("driver_log_verbosity"),
                 launcher: str = defaults.default("launcher"), env: dict[str, str] | None = None,
                 start_timeout: float = defaults.default("start_timeout"), spark=None,
                 slot_wait_timeout: float = defaults.default("slot_wait_timeout"), log_sink: LogSink | None = None,
                 timeline: str | os.PathLike | None = None,
                 timeline_interval: float = defaults.default("timeline_interval"),
                 timeline_live_bytes: int = defaults.default("timeline_live_bytes"),
                 mpi_args: list[str] | tuple[str, ...] = defaults.default("mpi_args"),
                 stall_timeout: float | None = defaults.default("stall_timeout"),
                 timeout: float | None = defaults.default("timeout"),
                 max_restarts: int = defaults.default("max_restarts"),
                 checkpoint_dir: str | os.PathLike | None = None):
        given = locals()
        for name, option in defaults.OPTIONS.items():
            setattr(self, name, option.check(given[name]))
        self.np = defaults.check_np(np)
        self.launcher = resolve_launcher(self.launcher)
        env = dict(env or {})
        bad = {k: v for k, v in env.items() if not isinstance(k, str) or not isinstance(v, str)}
        if bad:
            raise TypeError(f"env must map str to str; these entries do not: {bad!r}")
        self.env = env
        self._spark = spark
        self._log_sink = log_sink or print_log_sink()
        timeline = timeline or env.get("HOROVOD_TIMELINE") or os.environ.get("HOROVOD_TIMELINE")
        self.timeline = str(timeline) if timeline else None
        checkpoint_dir = checkpoint_dir or env.get(CHECKPOINT_DIR_ENV)
        self.checkpoint_dir = str(checkpoint_dir) if checkpoint_dir else None
        if self.max_restarts and not self.checkpoint_dir:
            log.warning("HorovodRunner: max_restarts=%d without checkpoint_dir: a restart starts training over "
                        "from the beginning", self.max_restarts)

    def run(self, main: Callable[..., Any], **kwargs: Any) -> Any:
        """Call ``main(**kwargs)`` on every rank; return rank 0's return value.

        ``main`` and ``kwargs`` are cloudpickled here, before any process or Spark
        job starts, so an unpicklable argument fails at once.
        """
        if not callable(main):
            raise TypeError(f"HorovodRunner.run(main, ...) needs a function, got {type(main).__name__}")
        t0 = time.monotonic()
        secret = payload.new_secret()
        call = payload.dumps_call(main, kwargs)
        sealed_call = payload.seal(call, secret, payload.KIND_CALL)
        name = getattr(main, "__qualname__", repr(main))
        # What every barrier task checks its Python can import before a rank starts.
        required = required_modules(main, call) if self.np > 0 else []
        del call
        sealed_result = self._run_attempts(secret, sealed_call, name, required)
        if sealed_result is None:
            raise HorovodRunError("HorovodRunner: every rank finished but rank 0 sent no result; "
                                  "this is a bug in airflow-provider-hvd, please report it.")
        value = cloudpickle.loads(payload.open_sealed(sealed_result, secret, payload.KIND_RESULT))
        log.info("HorovodRunner: %s finished on %d ranks in %.1f s", name, abs(self.np), time.monotonic() - t0)
        return value

    def _run_attempts(self, secret: bytes, sealed_call: bytes, name: str, required: list[str]) -> bytes | None:
        """The run's first attempt, and up to ``max_restarts`` more after failures a restart can cure."""
        run_id = uuid.uuid4().hex[:12]
        checkpoints = (RunCheckpoints(self.checkpoint_dir, run_id, self.env.get(RESUME_FROM_ENV))
                       if self.checkpoint_dir else None)
        history: list[str] = []
        try:
            for attempt in range(self.max_restarts + 1):
                t0 = time.monotonic()
                env = self._rank_env(run_id, attempt, checkpoints)
                try:
                    if self.np < 0:
                        return self._run_local(-self.np, secret, sealed_call, name, env, attempt)
                    return self._run_barrier(self.np, secret, sealed_call, name, required, env, attempt)
                except HorovodRunError as exc:
                    cause = restart_cause(exc)
                    restart = cause is not None and attempt < self.max_restarts
                    if not self.max_restarts:
                        raise
                    if restart:
                        outcome = f"{cause}; restarted"
                    elif cause:
                        outcome = f"{_first_line(exc)} ({cause}; no restart left)"
                    else:
                        outcome = f"{_first_line(exc)}; a restart cannot cure this"
                    history.append(f"attempt {attempt + 1} failed after {time.monotonic() - t0:.1f} s: {outcome}")
                    if not restart:
                        raise _with_history(exc, history, self.max_restarts)
                    if checkpoints is not None:
                        checkpoints.remove_partial()
                    log.warning("HorovodRunner: attempt %d of %d failed: %s. Restarting the %d ranks (restart %d of "
                                "%d)", attempt + 1, self.max_restarts + 1, cause, abs(self.np), attempt + 1,
                                self.max_restarts)
        finally:
            if checkpoints is not None:
                checkpoints.remove_partial()
        raise AssertionError("unreachable")

    @contextlib.contextmanager
    def _driver_side(self, secret: bytes, sealed_call: bytes, host: str,
                     tasks: int = 0, attempt: int = 0) -> Iterator[DriverService]:
        """The driver's services for one attempt: payload/log/result/rendezvous service, timeline.
        Closing them is what stops every rank, so it happens on every way out."""
        publisher = (TimelinePublisher(self.timeline, self.timeline_interval, self.timeline_live_bytes)
                     if self.timeline else None)
        service = DriverService(secret, sealed_call, self._log_sink, host=host,
                                on_timeline=publisher.add if publisher else None, tasks=tasks)
        destination = None
        try:
            yield service
        except HorovodRunError as exc:
            if attempt < self.max_restarts and restart_cause(exc):
                # Restarted: this attempt's trace is kept beside the run's, which the last attempt writes.
                destination = attempt_location(self.timeline, attempt + 1) if self.timeline else None
            raise
        finally:
            self._stop(service, publisher is not None)
            if publisher:
                publisher.finish(destination)

    def _stop(self, service: DriverService, timeline: bool) -> None:
        """Stop every rank still running. Launchers get a moment to report and, for rank 0,
        to ship the last of the timeline, and mpirun to end its job through its daemons (the
        wait ends as soon as they have left); then every channel closes, which ends the rest."""
        service.stop_ranks(grace=5.0 if timeline or self.launcher == "mpi" else 1.0)
        service.close()

    def _run_local(self, n: int, secret: bytes, sealed_call: bytes, name: str, env: dict[str, str],
                   attempt: int) -> bytes | None:
        from airflow_provider_hvd.runner.driver.local_launch import LOCAL_HOST, LocalMpiRun, LocalRanks

        log.info("HorovodRunner: running %s as %d local ranks on the driver (%s)", name, n, self.launcher)
        timeline_interval = self.timeline_interval if self.timeline else None
        with self._driver_side(secret, sealed_call, LOCAL_HOST, attempt=attempt) as service:
            if self.launcher == "mpi":
                ranks = LocalMpiRun(n, secret=secret, driver_port=service.port, env=env,
                                    forward_output=self.driver_log_verbosity == "all",
                                    timeline_interval=timeline_interval, mpi_args=self.mpi_args)
            else:
                ranks = LocalRanks(n, secret=secret, driver_port=service.port,
                                   env=env, forward_output=self.driver_log_verbosity == "all",
                                   timeline_interval=timeline_interval)
            try:
                ranks.start()
                return RunMonitor(n, service.events, start_timeout=self.start_timeout,
                                  where="local mode", stall_timeout=self.stall_timeout,
                                  timeout=self.timeout).wait()
            finally:
                self._stop(service, self.timeline is not None)
                ranks.stop()

    def _run_barrier(self, np: int, secret: bytes, sealed_call: bytes, name: str,
                     required: list[str], env: dict[str, str], attempt: int) -> bytes | None:
        from airflow_provider_hvd.runner.driver.barrier_job import BarrierJob
        from airflow_provider_hvd.runner.driver.cluster import check_cluster, describe_master, worker_python
        from airflow_provider_hvd.runner.driver.worker_diagnosis import diagnose

        sc = self._spark_context()
        check_cluster(sc, np, self.slot_wait_timeout)
        python = worker_python(sc)
        log.info("HorovodRunner: running %s as %d ranks in a Spark barrier stage on %s (%s)",
                 name, np, describe_master(sc), self.launcher)
        with self._driver_side(secret, sealed_call, "0.0.0.0", tasks=np, attempt=attempt) as service:
            spec = TaskSpec(driver_host=sc.getConf().get("spark.driver.host"), driver_port=service.port,
                            secret_hex=secret.hex(),
                            forward_output=self.driver_log_verbosity == "all", env=env,
                            timeline_interval=self.timeline_interval if self.timeline else None,
                            launcher=self.launcher, mpi_args=self.mpi_args)
            job = BarrierJob(sc, np, spec, f"HorovodRunner np={np}: {name}", python=python,
                             required_modules=required)
            try:
                job.start()
                result = RunMonitor(np, service.events, start_timeout=self.start_timeout,
                                    where=f"Spark master {describe_master(sc)}", stall_timeout=self.stall_timeout,
                                    timeout=self.timeout, ranks_of_task=service.ranks_of_task,
                                    explain_job_error=lambda e: diagnose(
                                        e, python, f"Spark master {describe_master(sc)}")).wait(job.error)
                # Every rank is done: release the tasks still serving (mpi's rsh agents) and give
                # the stage a moment to end by itself.
                self._stop(service, self.timeline is not None)
                if not job.join(timeout=60):
                    raise HorovodRunError("HorovodRunner: every rank finished but the Spark stage did not end "
                                          "within 60 s; it was cancelled. Check the executors' logs.")
                if job.error() is not None:
                    raise HorovodRunError(f"HorovodRunner: every rank finished but the Spark stage failed: "
                                          f"{job.error()}") from job.error()
                return result
            finally:
                self._stop(service, self.timeline is not None)
                job.stop()

    def _rank_env(self, run_id: str, attempt: int, checkpoints: RunCheckpoints | None) -> dict[str, str]:
        """The user's env for every rank, plus what the runner's own rank-side code reads."""
        env = dict(self.env)
        if self.stall_timeout is not None:
            env[LaunchEnv.STALL_TIMEOUT] = str(self.stall_timeout)
        env[RUN_ID_ENV] = run_id
        env[RESTART_ENV] = str(attempt)
        if self.checkpoint_dir:
            env[CHECKPOINT_DIR_ENV] = self.checkpoint_dir
        if attempt and checkpoints is not None:
            resume, own = checkpoints.resume_point()
            env.pop(RESUME_FROM_ENV, None)
            if resume:
                env[RESUME_FROM_ENV] = resume
            env[RESUME_IS_RESTART_ENV] = "1" if own else "0"
            log.info("HorovodRunner: restart %d resumes from %s", attempt,
                     (resume + (" (written by this run)" if own else " (where the run started)")) if resume
                     else "scratch: no checkpoint yet")
        elif attempt:
            log.info("HorovodRunner: restart %d starts training from the beginning (no checkpoint_dir)", attempt)
        return env

    def _spark_context(self):
        from pyspark import SparkContext
        from pyspark.sql import SparkSession

        if self._spark is not None:
            return getattr(self._spark, "sparkContext", self._spark)  # a SparkSession or a SparkContext
        session = SparkSession.getActiveSession()
        # With neither, a SparkContext: the barrier stage is an RDD job, and a new SparkSession would
        # load Spark SQL for nothing.
        return session.sparkContext if session is not None else SparkContext.getOrCreate()


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _with_history(exc: HorovodRunError, history: list[str], max_restarts: int) -> HorovodRunError:
    """The last attempt's own error, its message led by every attempt's line, so that a user
    catching RankFailedError (or any other) still can."""
    exc.attempts = list(history)
    restarts = len(history) - 1
    head = (f"HorovodRunner: the run failed after {restarts} restart(s) (max_restarts={max_restarts}). "
            "Attempts:\n" + "\n".join(f"  {line}" for line in history))
    exc.args = (f"{head}\n--- the last attempt's error ---\n{exc}",) + tuple(exc.args[1:])
    return exc
