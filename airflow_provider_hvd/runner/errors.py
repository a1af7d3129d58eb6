"""Errors a HorovodRunner user can catch. Every message says what went wrong and what to do."""

from __future__ import annotations


class HorovodRunError(RuntimeError):
    """A Horovod run did not complete.

    ``attempts``: with ``max_restarts``, one line per attempt of the run (its number, how long
    it ran, its cause, whether it was restarted); empty when the run had no restart budget."""

    attempts: list[str] = []


class RankFailedError(HorovodRunError):
    """A rank raised, exited non-zero or was killed. The first such rank is the one named.

    ``kind`` says how it failed, which decides whether a restart can cure it
    (driver/restart_policy.py): ``exception`` (the training function raised), ``peer_lost``
    (only Horovod's own HorovodInternalError: its peers vanished, e.g. a network failure
    between ranks), ``signal``, ``exit`` (a non-zero exit code without an exception),
    ``lost`` (its Spark task or executor died), ``unreachable`` (its host stopped answering: the
    driver's connection to its task timed out), ``daemon`` (Open MPI's orted or mpirun crashed).
    """

    KINDS = ("exception", "peer_lost", "signal", "exit", "lost", "unreachable", "daemon")

    def __init__(self, message: str, *, rank: int, host: str | None = None,
                 exc_type: str | None = None, returncode: int | None = None,
                 traceback: str | None = None, tail: list[str] | None = None, kind: str = "exception",
                 signal: str | None = None):
        super().__init__(message)
        if kind not in self.KINDS:
            raise ValueError(f"kind={kind!r}: one of {self.KINDS}")
        self.kind = kind
        self.signal = signal
        self.rank = rank
        self.host = host
        self.exc_type = exc_type
        self.returncode = returncode
        self.remote_traceback = traceback
        self.tail = tail or []


class MpiDaemonCrashError(RankFailedError):
    """An Open MPI process (the orted mpirun started on a host, or mpirun itself) crashed with a
    signal: Open MPI failed, not the training function. ``process``, ``host`` and ``signal``
    name it; ``tail`` keeps Open MPI's own lines."""

    def __init__(self, message: str, *, process: str, signal: str, rank: int, host: str | None,
                 returncode: int | None, tail: list[str]):
        super().__init__(message, rank=rank, host=host, returncode=returncode, tail=tail, kind="daemon",
                         signal=signal)
        self.process = process


class StartTimeoutError(HorovodRunError):
    """Not every rank started within ``start_timeout``."""

    def __init__(self, message: str, *, missing_ranks: list[int]):
        super().__init__(message)
        self.missing_ranks = missing_ranks


class StallError(HorovodRunError):
    """Some ranks waited in a collective, or for their peers to return, longer than ``stall_timeout``."""

    def __init__(self, message: str, *, stalled_ranks: list[int], waiting_ranks: list[int]):
        super().__init__(message)
        self.stalled_ranks = stalled_ranks
        self.waiting_ranks = waiting_ranks


class SparkStageError(HorovodRunError):
    """The Spark barrier stage failed and no rank said why. ``executor_lost``: Spark reported an
    executor lost (ExecutorLostFailure) for it."""

    def __init__(self, message: str, *, executor_lost: bool):
        super().__init__(message)
        self.executor_lost = executor_lost


class ClusterCapacityError(HorovodRunError):
    """The Spark cluster cannot run ``np`` barrier tasks at once."""


class PayloadError(HorovodRunError):
    """A payload or result envelope was refused before anything was unpickled."""


class SerializationError(HorovodRunError, TypeError):
    """The training function, a keyword argument or a result could not be pickled."""


class WorkerEnvironmentError(HorovodRunError):
    """A Spark worker's Python cannot run the ranks: a package or module is missing there, the
    Python executable does not exist, or its version does not match the driver's. Raised before
    any rank starts, naming the host, the worker's Python and the module."""

    def __init__(self, message: str, *, host: str | None = None, python: str | None = None,
                 module: str | None = None):
        super().__init__(message)
        self.host = host
        self.python = python
        self.module = module
