"""The barrier task's entry point: can this Spark worker's Python run the ranks? Asked before anything else.

The barrier task's body lives in this package, so a worker whose Python lacks the package
(Spark starts plain ``python3`` unless told otherwise) could not even unpickle it, and
Spark would only say "barrier task ResultTask(0, 0) finished unsuccessfully". So the
stage's entry point is ``checked_barrier_task``, shipped *by value* (pyspark's cloudpickle
is told so below; it uses the standard library only): it imports the runner, looks up
horovod and every module the call needs (``importlib.util.find_spec``: no import, a few
milliseconds), and when something is missing raises one line the driver recognises
(``WORKER_REPORT_MARKER`` + JSON). What fails before any of our code runs (the Python executable
does not exist, a Python PySpark refuses) comes back as Spark's own text.
driver/worker_diagnosis.py turns both into a WorkerEnvironmentError that names the host,
the worker's Python and the fix.
"""

from __future__ import annotations

import sys

# A plain str, captured by value with the function (an import of our package is what may fail).
from airflow_provider_hvd.runner.wire.launch import WORKER_REPORT_MARKER

MIN_PYTHON = (3, 11)


def checked_barrier_task(spec_fields: dict, required: list, rows):
    """Body of each barrier task: check the worker's Python, then run barrier_task's task.
    Runs in the executor's Python worker; only the standard library until the check passes."""
    import importlib.util
    import json as json_
    import os
    import socket
    import sys as sys_

    def refuse(problem: str, module: str | None, detail: str):
        # barrier_task.executor_host's rule, written out: that module may be what is missing.
        try:
            from pyspark import BarrierTaskContext

            ctx = BarrierTaskContext.get()
            host = os.environ.get("SPARK_LOCAL_IP") or ctx.getTaskInfos()[ctx.partitionId()].address.rsplit(":", 1)[0]
        except Exception:
            host = socket.gethostname()
        report = {"problem": problem, "module": module, "detail": detail, "host": host,
                  "python": sys_.executable, "version": "%d.%d.%d" % sys_.version_info[:3]}
        raise RuntimeError(WORKER_REPORT_MARKER + json_.dumps(report))

    if sys_.version_info[:2] < MIN_PYTHON:
        refuse("python", None, "airflow-provider-hvd needs Python >= %d.%d" % MIN_PYTHON)
    try:
        from airflow_provider_hvd.runner.barrier import barrier_task
        from airflow_provider_hvd.runner.wire.launch import TaskSpec
    except ImportError as exc:
        refuse("import", exc.name or "airflow_provider_hvd", f"{type(exc).__name__}: {exc}")
    for name in required:
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            refuse("import", name, f"No module named {name!r}")
    yield from barrier_task.run_barrier_task(TaskSpec(**spec_fields), rows)


def ship_by_value() -> None:
    """Make pyspark's own cloudpickle send ``checked_barrier_task`` by value, not as a reference
    to this module (which is exactly what a worker without the package cannot import)."""
    from pyspark import cloudpickle as spark_cloudpickle

    spark_cloudpickle.register_pickle_by_value(sys.modules[__name__])
