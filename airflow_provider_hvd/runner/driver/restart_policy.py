"""Which failures a restart can cure (``max_restarts``): one table, read top to bottom.

A restart relaunches the whole rank group from the newest checkpoint of the run. It helps
when the cluster lost something (an executor, a host, a rank's process, the network
between ranks) and a fresh barrier stage on the executors Spark has now can carry on. It
cannot help when the training function itself fails: the same code on the same data
fails again, so those fail at once, as without restarts.

The README's "Surviving a lost executor" section shows this table; tests/test_restarts.py
checks it row by row.
"""

from __future__ import annotations

from airflow_provider_hvd.runner.errors import (
    ClusterCapacityError,
    HorovodRunError,
    PayloadError,
    RankFailedError,
    SerializationError,
    SparkStageError,
    StallError,
    StartTimeoutError,
    WorkerEnvironmentError,
)

# (what happened, the error and its field, restarted?, why). Order matters: first match wins.
TABLE: list[tuple[str, str, bool, str]] = [
    ("a rank's Spark task or executor died (preemption, a lost host, an out-of-memory kill of the executor)",
     'RankFailedError, kind="lost"', True, "the cluster lost capacity; Spark replaces executors"),
    ("a rank's host stopped answering (the driver's connection to its task timed out: a network cut)",
     'RankFailedError, kind="unreachable"', False, "Spark still counts that host's executors until "
                                                   "spark.network.timeout: a new stage would wait on them"),
    ("the Spark stage failed with ExecutorLostFailure before any rank could say why",
     "SparkStageError, executor_lost=True", True, "as above"),
    ("a rank was killed by a signal (SIGKILL from the OOM killer or a preemption, SIGSEGV, SIGBUS)",
     'RankFailedError, kind="signal"', True, "the process died from outside the training function's "
                                             "control; a deterministic crash uses up max_restarts and then fails"),
    ("the ranks lost their peers: Horovod raised only HorovodInternalError (a network failure between ranks)",
     'RankFailedError, kind="peer_lost"', True, "the network or a peer failed, not the code"),
    ("Open MPI's orted or mpirun crashed", 'MpiDaemonCrashError (kind="daemon")', True,
     "Open MPI failed, not the code"),
    ("the training function raised an exception", 'RankFailedError, kind="exception"', False,
     "the same code on the same data raises again"),
    ("a rank exited with a non-zero code without an exception (sys.exit, os._exit)", 'RankFailedError, kind="exit"',
     False, "the code chose to exit"),
    ("ranks stalled in a collective past stall_timeout, or the run passed timeout", "StallError", False,
     "a hang in the code (or a too short limit) recurs"),
    ("ranks did not start within start_timeout", "StartTimeoutError", False,
     "slow imports or an unreachable host: configuration, not chance"),
    ("a worker's Python cannot run the ranks", "WorkerEnvironmentError", False, "configuration"),
    ("the cluster has fewer than np slots", "ClusterCapacityError", False,
     "the wait for slots is already bounded by slot_wait_timeout"),
    ("a payload or result was refused, or could not be pickled", "PayloadError, SerializationError", False,
     "the same bytes are refused again"),
    ("anything else", "HorovodRunError", False, "unknown causes are not retried blindly"),
]

_NOT_RESTARTED = (StallError, StartTimeoutError, WorkerEnvironmentError, ClusterCapacityError, PayloadError,
                  SerializationError)
_RESTARTED_KINDS = {
    "lost": "lost executor",
    "signal": "killed by {signal}",
    "peer_lost": "ranks lost their peers (network failure between ranks)",
    "daemon": "Open MPI daemon crash",
}


def restart_cause(error: BaseException) -> str | None:
    """A short name for the cause when a restart can cure ``error``; None when it cannot."""
    if not isinstance(error, HorovodRunError) or isinstance(error, _NOT_RESTARTED):
        return None
    if isinstance(error, RankFailedError):
        cause = _RESTARTED_KINDS.get(error.kind)
        if cause is None:
            return None
        return cause.format(signal=error.signal or "a signal") + (f" (rank {error.rank} on {error.host})"
                                                                    if error.host else f" (rank {error.rank})")
    if isinstance(error, SparkStageError) and error.executor_lost:
        return "lost executor (Spark stage failed)"
    return None

