"""Every message the processes of a run exchange, declared once.

A run's processes talk over authenticated channels (channel.py). Each connection
opens with a *hello* naming the peer's ``Role``; after that every JSON frame carries
an ``"op"`` from ``Op``, and some are followed by one bytes frame (``CARRIES_BYTES``).
On the driver, whatever matters for the run's outcome becomes an ``Event`` of a
``EventKind`` (driver/service.py) that driver/monitor.py reads.

Senders write ``{"op": Op.LOG, ...}`` (a ``StrEnum`` member is its string on the wire);
receivers parse with ``Op(message["op"])``, so an unknown op is a ValueError naming
it, never a message silently ignored. tests/test_layout.py checks that no module
spells an op, role, stream or event as a bare string, and that every ``Op.X`` it
names exists, so a typo fails a test instead of hanging a run.

Who sends what (sender -> receiver: fields):

  hello (first frame of every connection, answered by the server with ``{"ok": true}``)
    task -> driver           Role.TASK:      partition, info {host, rsh_port, gpus}
    rendezvous proxy -> drv  Role.KV:        rank
    launcher -> driver       Role.LAUNCHER:  rank, host, pid [, ranks, hosts] (mpirun speaks for all)
    rank -> driver           Role.RANK:      rank, host, pid
    rsh agent -> rsh service Role.RSH_AGENT

  rank -> driver       GET_PAYLOAD (answered by the sealed call as bytes), LOG {stream, line},
                       EXCEPTION {type, message, traceback, hint, while_loading}, STALLED {waiting_s,
                       pending}, RETURNED, RESULT {size} + bytes (rank 0), BYE
  launcher -> driver   LOG {rank, stream, line}, DIAGNOSTIC {line}, TIMELINE {size} + bytes,
                       EXITED {rank, returncode, host, pid, tail, signal, stopped_by_driver}, BYE
  task -> driver       BYE (the task has nothing left to serve)
  driver -> task       ROSTER {tasks}: every task's info, in partition order
  driver -> launcher   STOP (also to tasks still serving): the run is over, stop and report
  proxy -> driver      KV_GET / KV_PUT + bytes / KV_DELETE {scope, key}, BYE;
                       answered by {status} (+ bytes for a found KV_GET)
  agent -> rsh service EXEC {command}; answered by OUT {stream, data}... then EXIT {code}
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass, field


class Role(enum.StrEnum):
    """Who opened a connection (the ``role`` of its hello)."""
    TASK = "task"              # a barrier task, joining the roster
    KV = "kv"                  # a gloo rank's rendezvous proxy
    LAUNCHER = "launcher"      # what started a rank process (RankProcess) or all of them (MpiRun)
    RANK = "rank"              # the rank process itself
    RSH_AGENT = "rsh-agent"    # mpirun's rsh agent, asking a host's barrier task to start orted


class Op(enum.StrEnum):
    """The ``op`` of every message after the hello."""
    # rank -> driver
    GET_PAYLOAD = "get_payload"
    EXCEPTION = "exception"
    STALLED = "stalled"
    RETURNED = "returned"
    RESULT = "result"
    # rank or launcher -> driver
    LOG = "log"
    # launcher -> driver
    DIAGNOSTIC = "diagnostic"
    TIMELINE = "timeline"
    EXITED = "exited"
    # any peer -> the one it leaves: it is done, not dead
    BYE = "bye"
    # driver -> task / launcher
    ROSTER = "roster"
    STOP = "stop"
    # rendezvous proxy -> driver's key-value store
    KV_GET = "get"
    KV_PUT = "put"
    KV_DELETE = "delete"
    # rsh agent <-> a host's rsh service
    EXEC = "exec"
    OUT = "out"
    EXIT = "exit"


# Ops whose JSON frame is followed by exactly one bytes frame.
CARRIES_BYTES = frozenset({Op.RESULT, Op.TIMELINE, Op.KV_PUT})


class Stream(enum.StrEnum):
    """Where a logged line came from (the ``<stream>`` of ``[rank]<stream>: line``)."""
    STDOUT = "stdout"
    STDERR = "stderr"
    LOG = "log"          # log_to_driver, and the runner's own notes from a rank
    MPIRUN = "mpirun"    # mpirun's own words, not a rank's


class EventKind(enum.StrEnum):
    """What the driver service tells the monitor (driver/service.py's ``Event.kind``)."""
    RANK_STARTED = "rank_started"          # a rank process connected
    RANK_CLOSED = "rank_closed"            # its channel ended (after its result, for rank 0)
    LAUNCHER_STARTED = "launcher_started"  # its launcher connected (one per rank it holds)
    LAUNCHER_LOST = "launcher_lost"        # a launcher or task vanished without BYE: its executor died
    LAUNCHER_SAID = "launcher_said"        # mpirun's own line or a start snapshot, quoted if start fails
    EXCEPTION = "exception"                # the training function raised
    EXITED = "exited"                      # a rank process ended (returncode, signal, tail)
    RETURNED = "returned"                  # the training function returned
    RESULT = "result"                      # rank 0's sealed result (the event's blob)
    STALLED = "stalled"                    # a collective pending past stall_timeout


@dataclass(frozen=True)
class TaskSpec:
    """Everything a barrier task needs; small, since Spark ships it with every task. The driver
    builds it (driver/barrier_job.py), each task reads it (barrier/barrier_task.py)."""
    driver_host: str
    driver_port: int
    secret_hex: str
    forward_output: bool
    env: dict[str, str] = field(default_factory=dict)
    timeline_interval: float | None = None
    launcher: str = "gloo"
    mpi_args: tuple[str, ...] = ()

    def to_fields(self) -> dict:
        """Plain builtins only: these travel by value beside the task's entry point to workers that
        may lack this package, where a ``LaunchEnv`` key (an enum of ours) could not be unpickled."""
        fields = dataclasses.asdict(self)
        fields["env"] = {str(k): str(v) for k, v in self.env.items()}
        fields["mpi_args"] = tuple(str(a) for a in self.mpi_args)
        fields["launcher"] = str(self.launcher)
        return fields


# The environment that carries a run from mpirun to its ranks (barrier/mpi_run.py sets it,
# rank/main.py reads and removes it before user code runs, barrier/rsh_agent.py reads the RSH ones).
class LaunchEnv(enum.StrEnum):
    DRIVER = "HVD_DRIVER_ADDR"
    SECRET = "HVD_RUN_SECRET"
    GPUS_BY_RANK = "HVD_GPUS_BY_RANK"
    RSH_MAP = "HVD_RSH_MAP"
    RSH_SECRET = "HVD_RSH_SECRET"
    # Each host's Python and working directory, set by that host's barrier task: executors'
    # environments need not be at the same path on every host (spark.archives unpacks one each).
    RANK_PYTHON = "HVD_RANK_PYTHON"
    RANK_CWD = "HVD_RANK_CWD"
    # What the driver's runner tells every rank (rank/stall.py)
    STALL_TIMEOUT = "HVD_RUNNER_STALL_TIMEOUT_S"


# The modules processes start each other by (``python -m ...``): a rename that misses one of
# these strings would start nothing, so tests/test_layout.py checks each can be found.
RANK_MAIN_MODULE = "airflow_provider_hvd.runner.rank.main"
RSH_AGENT_MODULE = "airflow_provider_hvd.runner.barrier.rsh_agent"

# The line mpirun's rsh agent (barrier/rsh_agent.py) writes to mpirun's stderr when the orted it
# started died of a signal, followed by a JSON {host, signal, code}; barrier/mpi_output.py reads it.
DAEMON_DIED_MARKER = "HVD-MPI-DAEMON-DIED:"

# The one line a barrier task raises when its Python cannot run a rank (barrier/entry.py), followed
# by a JSON report; driver/worker_diagnosis.py finds it in Spark's job error.
WORKER_REPORT_MARKER = "HVD-WORKER-ENVIRONMENT:"
