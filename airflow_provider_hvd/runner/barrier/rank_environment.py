"""What a rank inherits from the process that starts it: that host's environment, less Spark's plumbing.

A barrier task runs inside Spark's Python worker, whose environment carries the worker
protocol's settings and the secret its daemon checks (``PYTHON_WORKER_FACTORY_SECRET``), and
a spark-submitted driver carries the py4j gateway's (``PYSPARK_GATEWAY_SECRET``). None of it
is for the training function or the processes it starts (a DataLoader worker, a shell
command), so every launcher (RankProcess's environment, mpirun's and the orted it starts
through the rsh service) begins from ``rank_base_env()``. The names are the ones pyspark
4.2's worker, daemon and gateway code read; the host's own settings stay (PATH, HOME,
SPARK_HOME, SPARK_LOCAL_DIRS, the user's PYTHONPATH entries, spark.executorEnv.*).
"""

from __future__ import annotations

import os
import re
from typing import Mapping

# Spark's Python worker protocol and its secrets: pyspark/worker.py, daemon.py, java_gateway.py.
SPARK_PLUMBING = frozenset({
    "PYTHON_WORKER_FACTORY_SECRET", "PYTHON_WORKER_FACTORY_PORT", "PYTHON_WORKER_FACTORY_SOCK_DIR",
    "PYTHON_UNIX_DOMAIN_ENABLED", "PYTHON_UDF_BATCH_SIZE", "PYTHON_DAEMON_KILL_WORKER_ON_FLUSH_FAILURE",
    "PYTHON_FAULTHANDLER_DIR", "SPARK_AUTH_SOCKET_TIMEOUT", "SPARK_BUFFER_SIZE", "SPARK_REUSE_WORKER",
    "SPARK_PYTHON_RUNTIME", "SPARK_CONNECT_MODE", "SPARK_JOB_ARTIFACT_UUID", "SPARK_SIMPLIFIED_TRACEBACK",
    "SPARK_HIDE_TRACEBACK", "PYSPARK_GATEWAY_PORT", "PYSPARK_GATEWAY_SECRET", "_PYSPARK_DRIVER_CONN_INFO_PATH",
    "PYSPARK_EXECUTOR_MEMORY_MB", "PYSPARK_PLANNER_MEMORY_MB",
})
# What Spark puts on a worker's PYTHONPATH for its own use: pyspark's and py4j's archives, $SPARK_HOME/python.
_SPARK_PATH_ENTRY = re.compile(r"(^|/)(pyspark\.zip|py4j-[\w.]+-src\.zip)$")


def rank_base_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """``environ`` (default: this process's) without Spark's plumbing, for a rank to start from."""
    environ = os.environ if environ is None else environ
    env = {k: v for k, v in environ.items() if k not in SPARK_PLUMBING}
    if "PYTHONPATH" in env:
        spark_python = os.path.join(environ.get("SPARK_HOME", "\0"), "python")
        kept = [p for p in env["PYTHONPATH"].split(os.pathsep)
                if p and not _SPARK_PATH_ENTRY.search(p.rstrip("/")) and p.rstrip("/") != spark_python]
        if kept:
            env["PYTHONPATH"] = os.pathsep.join(kept)
        else:
            del env["PYTHONPATH"]
    return env
