"""RunMonitor's reading of a failed Spark stage, with the text Spark 4.2 really writes.

A killed executor's Spark error can reach the driver before any rank-level report
(its Python worker, which holds our channel, may outlive the JVM): seen in CI with
tests/test_runner_clusters.py. The error must then still name the rank and host.
"""

import queue
import time

import pytest

from airflow_provider_hvd.runner.driver.service import Event
from airflow_provider_hvd.runner.errors import HorovodRunError, RankFailedError
from airflow_provider_hvd.runner.driver.monitor import RunMonitor
from airflow_provider_hvd.runner.wire.messages import DaemonDeath, EventKind, Exited
from airflow_provider_hvd.runner.wire.hellos import LauncherHello, RankHello

# Spark 4.2.0's message for a standalone executor SIGKILLed under a barrier task (CI log, 2026-12-02).
EXECUTOR_LOST = (
    "An error occurred while calling z:org.apache.spark.api.python.PythonRDD.collectAndServe.\n"
    ": org.apache.spark.SparkException: Job aborted due to stage failure: Could not recover from a failed "
    "barrier ResultStage. Most recent failure reason: Stage failed because barrier task ResultTask(6, 1) "
    "finished unsuccessfully.\nExecutorLostFailure (executor 2 exited caused by one of the running tasks) "
    "Reason: Command exited with code 137\n\tat org.apache.spark.scheduler.DAGScheduler...")


def running_monitor(ranks_of_task):
    events = queue.Queue()
    hosts = ["127.0.0.2", "127.0.0.3"]
    for rank in (0, 1):  # mpirun's launcher speaks for both ranks
        events.put(Event(EventKind.LAUNCHER_STARTED, rank, LauncherHello(rank=0, host=hosts[0], hosts=hosts,
                                                                        ranks=[0, 1])))
        events.put(Event(EventKind.RANK_STARTED, rank, RankHello(rank=rank, pid=1000 + rank)))
    return events, RunMonitor(2, events, start_timeout=60, where="test", ranks_of_task=ranks_of_task)


def test_a_lost_executor_is_named_by_its_rank_and_host_when_spark_reports_first():
    events, monitor = running_monitor({0: [0], 1: [1]}.get)
    t0 = time.monotonic()
    with pytest.raises(RankFailedError) as info:
        monitor.wait(lambda: RuntimeError(EXECUTOR_LOST))
    err = info.value
    assert (err.rank, err.host) == (1, "127.0.0.3")
    assert "rank 1 (host 127.0.0.3, pid 1001)" in str(err) and "executor 2 died" in str(err)
    assert "137 is SIGKILL" in str(err)
    assert time.monotonic() - t0 < 3


def test_a_rank_level_report_within_the_grace_wins_over_the_spark_error():
    events, monitor = running_monitor({0: [0], 1: [1]}.get)
    events.put(Event(EventKind.EXITED, 1, Exited(returncode=-9, signal="SIGKILL", host="127.0.0.3", tail=[])))
    with pytest.raises(RankFailedError, match="rank 1 .* was killed by signal SIGKILL"):
        monitor.wait(lambda: RuntimeError(EXECUTOR_LOST))


def test_any_other_stage_failure_is_reported_as_it_is():
    events, monitor = running_monitor(lambda partition: [])
    with pytest.raises(HorovodRunError, match="the Spark barrier stage failed before the ranks finished") as info:
        monitor.wait(lambda: RuntimeError("org.apache.spark.SparkException: something else"))
    assert not isinstance(info.value, RankFailedError)


def test_an_open_mpi_daemon_crash_is_named_at_once_in_our_words():
    from airflow_provider_hvd.runner.errors import MpiDaemonCrashError

    events, monitor = running_monitor(lambda partition: [])
    tail = ["<mpirun> [host:1] Signal: Segmentation fault (11)", "<mpirun> ORTE was unable to reliably start"]
    events.put(Event(EventKind.EXITED, 0, Exited(returncode=1, tail=tail, daemon=DaemonDeath(
        process="orted", host="127.0.0.3", signal="SIGSEGV", code=139))))
    t0 = time.monotonic()
    with pytest.raises(MpiDaemonCrashError) as info:
        monitor.wait()
    assert time.monotonic() - t0 < 1  # no wait for an exception report that cannot come
    err = info.value
    assert (err.process, err.host, err.signal) == ("orted", "127.0.0.3", "SIGSEGV")
    # The ranks named are the ones on that host (rank 1, from mpirun's launcher's host list).
    assert err.rank == 1 and "started on host 127.0.0.3 crashed with SIGSEGV, taking rank(s) [1]" in str(err)
    assert "Open MPI failed, not the training function" in str(err) and "exited with code" not in str(err)
    assert "Signal: Segmentation fault (11)" in str(err)  # Open MPI's own lines kept
