"""What starts a run's processes: the spec Spark ships to every barrier task, the environment mpirun
hands its ranks, the modules processes start each other by, and the marker lines they leave."""

from __future__ import annotations

import dataclasses
import enum
import json
import re
from dataclasses import dataclass, field

from airflow_provider_hvd.runner.wire.records import DaemonDeath, as_type


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
# started died of a signal, followed by a DaemonDeath as JSON; barrier/mpi_output.py reads it.
DAEMON_DIED_MARKER = "HVD-MPI-DAEMON-DIED:"

# The one line a barrier task raises when its Python cannot run a rank (barrier/entry.py), followed
# by a WorkerReport as JSON; driver/worker_diagnosis.py finds it in Spark's job error.
WORKER_REPORT_MARKER = "HVD-WORKER-ENVIRONMENT:"


@dataclass(frozen=True)
class WorkerReport:
    """Why a worker's Python cannot run a rank. barrier/entry.py writes these fields by hand (it may
    use the standard library only); tests/test_messages.py holds the two to the same names."""
    problem: str                # "python" (too old) or "import"
    host: str = "?"
    python: str = "?"           # the worker's executable
    version: str = "?"          # its Python version
    module: str | None = None   # the module it could not find
    detail: str = ""


def marker_line(marker: str, record: DaemonDeath | WorkerReport) -> str:
    return marker + json.dumps(dataclasses.asdict(record))


def find_marked(marker: str, cls: type, text: str):
    """The first record ``marker`` introduces in ``text`` as ``cls``, or None (none there, or not one)."""
    found = re.search(re.escape(marker) + r"(\{.*?\})\s*$", text, re.M)
    if not found:
        return None
    try:
        return as_type(cls, json.loads(found.group(1)))
    except ValueError:
        return None
