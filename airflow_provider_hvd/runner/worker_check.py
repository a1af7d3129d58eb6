"""Can this Spark worker's Python run the ranks? Every barrier task asks before anything else.

The barrier task's body lives in this package, so a worker whose Python lacks the package
(Spark starts plain ``python3`` unless told otherwise) could not even unpickle it, and
Spark would only say "barrier task ResultTask(0, 0) finished unsuccessfully". So the
stage's entry point is ``checked_barrier_task``, shipped *by value* (pyspark's cloudpickle
is told so below; it uses the standard library only): it imports the runner, looks up
horovod and every module the call needs (``importlib.util.find_spec``: no import, a few
milliseconds), and when something is missing raises one line the driver recognises
(``REPORT_MARKER`` + JSON). What fails before any of our code runs (the Python executable
does not exist, a Python PySpark refuses) comes back as Spark's own text. ``diagnose`` turns
both into a WorkerEnvironmentError that names the host, the worker's Python and the fix.
"""

from __future__ import annotations

import json
import re
import sys

from airflow_provider_hvd.runner.errors import WorkerEnvironmentError

REPORT_MARKER = "HVD-WORKER-ENVIRONMENT:"
MIN_PYTHON = (3, 11)


def checked_barrier_task(spec_fields: dict, required: list, rows):
    """Body of each barrier task: check the worker's Python, then run spark_launch's task.
    Runs in the executor's Python worker; only the standard library until the check passes."""
    import importlib.util
    import json as json_
    import os
    import socket
    import sys as sys_

    def refuse(problem: str, module: str | None, detail: str):
        # spark_launch.executor_host's rule, written out: that module may be what is missing.
        try:
            from pyspark import BarrierTaskContext

            ctx = BarrierTaskContext.get()
            host = os.environ.get("SPARK_LOCAL_IP") or ctx.getTaskInfos()[ctx.partitionId()].address.rsplit(":", 1)[0]
        except Exception:
            host = socket.gethostname()
        report = {"problem": problem, "module": module, "detail": detail, "host": host,
                  "python": sys_.executable, "version": "%d.%d.%d" % sys_.version_info[:3]}
        raise RuntimeError(REPORT_MARKER + json_.dumps(report))

    if sys_.version_info[:2] < MIN_PYTHON:
        refuse("python", None, "airflow-provider-hvd needs Python >= %d.%d" % MIN_PYTHON)
    try:
        from airflow_provider_hvd.runner import spark_launch
    except ImportError as exc:
        refuse("import", exc.name or "airflow_provider_hvd", f"{type(exc).__name__}: {exc}")
    for name in required:
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            refuse("import", name, f"No module named {name!r}")
    yield from spark_launch.run_barrier_task(spark_launch.TaskSpec(**spec_fields), rows)


def ship_by_value() -> None:
    """Make pyspark's own cloudpickle send ``checked_barrier_task`` by value, not as a reference
    to this module (which is exactly what a worker without the package cannot import)."""
    from pyspark import cloudpickle as spark_cloudpickle

    spark_cloudpickle.register_pickle_by_value(sys.modules[__name__])


# ---- driver side: Spark's job error -> WorkerEnvironmentError -------------------------------

_REPORT = re.compile(re.escape(REPORT_MARKER) + r"(\{.*?\})\s*$", re.M)
_LOST_TASK_HOST = re.compile(r"\(TID \d+\) \(([^\s)]+) executor [^)]+\)")
_CANNOT_RUN = re.compile(r'Cannot run program "([^"]+)"[^:\n]*: ([^\n]+)')
_VERSION_MISMATCH = re.compile(r"Python in worker has different version:? \(?([\d., ]+)\)? than that in driver:? "
                               r"\(?([\d., ]+)\)?")
_NO_PYSPARK = re.compile(r"No module named '?pyspark'?")
# PySpark's daemon died while starting: Spark quotes its traceback under this line.
_WORKER_START = re.compile(r"Error from python worker:\n(.*?)\n(?:PYTHONPATH was:|$)", re.S)
_LIB_VERSION = re.compile(r"/(?:python|pypy)(\d+\.\d+)/")

FIX = ("Install airflow-provider-hvd, horovod (built as scripts/setup.sh builds it) and the training function's "
       "modules into the Python the workers run, or point the workers at a Python that has them: "
       "spark.pyspark.python (or PYSPARK_PYTHON) for an interpreter installed on every worker, or "
       "spark.archives with a packed environment (docs/deploy.md, 'Workers without the packages').")


def diagnose(job_error: BaseException | str, worker_python: str,
             where: str = "the cluster") -> WorkerEnvironmentError | None:
    """The WorkerEnvironmentError a failed barrier stage stands for, or None when it is something else.
    ``worker_python``: the executable the driver told the workers to run; ``where``: how to name
    the cluster when Spark's text does not name the host."""
    text = str(job_error)
    found = _REPORT.search(text)
    if found:
        try:
            report = json.loads(found.group(1))
        except ValueError:
            report = None
        if report:
            return _from_report(report)
    lost_on = _LOST_TASK_HOST.search(text)
    host = lost_on.group(1) if lost_on else None
    worker = f"the Spark worker on host {host}" if host else f"a Spark worker ({where})"
    driver = "%d.%d" % sys.version_info[:2]
    cannot_run = _CANNOT_RUN.search(text)
    if cannot_run:
        return WorkerEnvironmentError(
            f"HorovodRunner: {worker} could not start Python {cannot_run.group(1)!r} "
            f"({cannot_run.group(2).strip()}): no such executable there. {FIX}", host=host, python=cannot_run.group(1))
    mismatch = _VERSION_MISMATCH.search(text)
    if mismatch:
        worker_version, driver_version = (_version(g) for g in mismatch.groups())
        return WorkerEnvironmentError(
            f"HorovodRunner: {worker} runs Python {worker_version} ({worker_python}) but the driver runs "
            f"Python {driver_version}: PySpark needs the same minor version on both. {FIX}",
            host=host, python=worker_python)
    if _NO_PYSPARK.search(text):
        return WorkerEnvironmentError(
            f"HorovodRunner: {worker} cannot import pyspark in Python {worker_python}. {FIX}",
            host=host, python=worker_python, module="pyspark")
    start = _WORKER_START.search(text)
    if start:
        lines = [line.strip() for line in start.group(1).strip().splitlines() if line.strip()]
        version = _LIB_VERSION.search(start.group(1))
        seen = f" (its traceback runs in a Python {version.group(1)} library)" if version else ""
        return WorkerEnvironmentError(
            f"HorovodRunner: {worker} could not start PySpark's Python worker under {worker_python}{seen}: "
            f"{lines[-1] if lines else 'no output'}. The workers need the driver's Python version ({driver}) "
            f"with PySpark's dependencies. {FIX}", host=host, python=worker_python)
    return None


def _from_report(report: dict) -> WorkerEnvironmentError:
    host, python, version = report.get("host", "?"), report.get("python", "?"), report.get("version", "?")
    if report.get("problem") == "python":
        return WorkerEnvironmentError(
            f"HorovodRunner: the Spark worker on host {host} runs Python {version} ({python}): "
            f"{report.get('detail')}. {FIX}", host=host, python=python)
    module = report.get("module") or "?"
    return WorkerEnvironmentError(
        f"HorovodRunner: the Spark worker on host {host} cannot import {module!r} in Python {python} "
        f"({version}): {report.get('detail')}. Nothing was started. {FIX}", host=host, python=python, module=module)


def _version(text: str) -> str:
    return ".".join(p.strip() for p in text.replace(",", ".").split(".") if p.strip())[:10]
