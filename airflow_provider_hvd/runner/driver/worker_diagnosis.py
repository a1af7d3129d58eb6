"""A failed barrier stage that stands for a worker whose Python cannot run ranks, in words.

Every barrier task first checks its worker's Python (barrier/entry.py) and, on a miss, raises
one marker line with a JSON report; what fails before any of our code runs (no such
executable, a Python PySpark refuses, a version mismatch) comes back as Spark's own text.
``diagnose`` reads either out of Spark's job error and returns the WorkerEnvironmentError
that names the host, the worker's Python, the module and the fix.
"""

from __future__ import annotations

import re
import sys

from airflow_provider_hvd.runner.errors import WorkerEnvironmentError
from airflow_provider_hvd.runner.wire.launch import WORKER_REPORT_MARKER, WorkerReport, find_marked


_LOST_TASK_HOST = re.compile(r"\(TID \d+\) \(([^\s)]+) executor [^)]+\)")
_CANNOT_RUN = re.compile(r'Cannot run program "([^"]+)"[^:\n]*: ([^\n]+)')
_VERSION_MISMATCH = re.compile(r"Python in worker has different version:? \(?([\d., ]+)\)? than that in driver:? "
                               r"\(?([\d., ]+)\)?")
_NO_PYSPARK = re.compile(r"No module named '?pyspark'?")
# PySpark's daemon died while starting: Spark quotes its traceback under this line.
_WORKER_START = re.compile(r"Error from python worker:\n(.*?)\n(?:PYTHONPATH was:|$)", re.S)
_LIB_VERSION = re.compile(r"/(?:python|pypy)(\d+\.\d+)/")
# The operator's application runs this package's worker daemon (barrier/worker_daemon.py): a worker
# Python without the package fails there, before the barrier task's own check could say so.
# (runpy names a missing last module without quotes: "No module named a.b.worker_daemon".)
_NO_PACKAGE = re.compile(r"No module named '?(airflow_provider_hvd[\w.]*)'?")

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
    report = find_marked(WORKER_REPORT_MARKER, WorkerReport, text)
    if report is not None:
        return _from_report(report)
    lost_on = _LOST_TASK_HOST.search(text)
    host = lost_on.group(1) if lost_on else None
    worker = f"the Spark worker on host {host}" if host else f"a Spark worker ({where})"
    for reading in (_cannot_run, _version_mismatch, _no_pyspark, _worker_start):
        error = reading(text, worker, host, worker_python)
        if error is not None:
            return error
    return None


def _cannot_run(text: str, worker: str, host: str | None, worker_python: str) -> WorkerEnvironmentError | None:
    cannot_run = _CANNOT_RUN.search(text)
    if not cannot_run:
        return None
    return WorkerEnvironmentError(
        f"HorovodRunner: {worker} could not start Python {cannot_run.group(1)!r} "
        f"({cannot_run.group(2).strip()}): no such executable there. {FIX}", host=host, python=cannot_run.group(1))


def _version_mismatch(text: str, worker: str, host: str | None, worker_python: str) -> WorkerEnvironmentError | None:
    mismatch = _VERSION_MISMATCH.search(text)
    if not mismatch:
        return None
    worker_version, driver_version = (_version(g) for g in mismatch.groups())
    return WorkerEnvironmentError(
        f"HorovodRunner: {worker} runs Python {worker_version} ({worker_python}) but the driver runs "
        f"Python {driver_version}: PySpark needs the same minor version on both. {FIX}",
        host=host, python=worker_python)


def _no_pyspark(text: str, worker: str, host: str | None, worker_python: str) -> WorkerEnvironmentError | None:
    if not _NO_PYSPARK.search(text):
        return None
    return WorkerEnvironmentError(
        f"HorovodRunner: {worker} cannot import pyspark in Python {worker_python}. {FIX}",
        host=host, python=worker_python, module="pyspark")


def _worker_start(text: str, worker: str, host: str | None, worker_python: str) -> WorkerEnvironmentError | None:
    """PySpark's worker daemon died while starting: our daemon module missing, or another cause."""
    start = _WORKER_START.search(text)
    if not start:
        return None
    no_package = _NO_PACKAGE.search(start.group(1))
    if no_package:
        module = no_package.group(1)
        # Only a submodule missing: the package is there, from a release before the driver's.
        older = "" if module == "airflow_provider_hvd" else " (its airflow-provider-hvd is older than the driver's)"
        return WorkerEnvironmentError(
            f"HorovodRunner: {worker} cannot import {module!r} in Python {worker_python}{older}: PySpark's "
            f"worker daemon there is this package's (spark.python.daemon.module). Nothing was started. {FIX}",
            host=host, python=worker_python, module=module)
    lines = [line.strip() for line in start.group(1).strip().splitlines() if line.strip()]
    version = _LIB_VERSION.search(start.group(1))
    seen = f" (its traceback runs in a Python {version.group(1)} library)" if version else ""
    return WorkerEnvironmentError(
        f"HorovodRunner: {worker} could not start PySpark's Python worker under {worker_python}{seen}: "
        f"{lines[-1] if lines else 'no output'}. The workers need the driver's Python version "
        f"({'%d.%d' % sys.version_info[:2]}) with PySpark's dependencies. {FIX}", host=host, python=worker_python)


def _from_report(report: WorkerReport) -> WorkerEnvironmentError:
    host, python, version = report.host, report.python, report.version
    if report.problem == "python":
        return WorkerEnvironmentError(
            f"HorovodRunner: the Spark worker on host {host} runs Python {version} ({python}): "
            f"{report.detail}. {FIX}", host=host, python=python)
    module = report.module or "?"
    return WorkerEnvironmentError(
        f"HorovodRunner: the Spark worker on host {host} cannot import {module!r} in Python {python} "
        f"({version}): {report.detail}. Nothing was started. {FIX}", host=host, python=python, module=module)


def _version(text: str) -> str:
    return ".".join(p.strip() for p in text.replace(",", ".").split(".") if p.strip())[:10]
