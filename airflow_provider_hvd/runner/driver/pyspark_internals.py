"""The private parts of pyspark the runner relies on, in one place, each with why.

PySpark has no public API for these five things; each use is wrapped here, and
tests/test_private_apis.py fails loudly, naming the attribute, when a pyspark upgrade
changes one (pin pyspark and read that test before upgrading).

- ``SparkContext.pythonExec``: the Python executable the executors start for an RDD.
  Spark sets it once per context from ``spark.pyspark.python`` / ``PYSPARK_PYTHON``; we
  need it for *our* RDD only (the worker Python ``cluster.worker_python`` picks), so the
  user's other jobs keep theirs.
- ``RDD._jrdd``: pyspark reads ``pythonExec`` when it wraps the Python function into the
  JVM's PythonRDD, which happens lazily on first access to ``_jrdd``. Touching it while
  ``pythonExec`` is set fixes the executable for this RDD; ``collect()`` later reuses it.
- ``SparkContext._jsc.sc().maxNumConcurrentTasks(profile)``: the count of task slots the
  cluster offers now, the very number Spark's barrier scheduler checks. The public
  ``defaultParallelism`` is a configured default, not free slots.
- ``SparkContext._jsc.stop()``: the JVM half of ``SparkContext.stop()``. The public method then
  shuts pyspark's accumulator server down, which waits for its connection handler's poll; a driver about to end its process (runner/spark_app.py) need not wait for a thread that
  dies with it.
- ``SparkContext._ensure_initialized()``: starts (or, under spark-submit, joins) the JVM gateway.
  A ``SparkConf()`` made before it is a bare Python dict that knows none of spark-submit's
  properties, and whatever is set on it *overrides* them when the context starts: editing
  ``spark.jars`` there would drop the user's own jars (runner/spark_app.py edits it).
"""

from __future__ import annotations

import contextlib
import threading
from typing import Iterator

_EXEC_LOCK = threading.Lock()


@contextlib.contextmanager
def python_exec(sc, python: str) -> Iterator[None]:
    """``sc.pythonExec`` set to ``python`` meanwhile, under a lock (other threads may wrap RDDs)."""
    with _EXEC_LOCK:
        before = sc.pythonExec
        sc.pythonExec = python
        try:
            yield
        finally:
            sc.pythonExec = before


def wrap_python_function(rdd) -> None:
    """Make pyspark wrap ``rdd``'s Python function now (reading ``sc.pythonExec`` now)."""
    rdd._jrdd  # noqa: B018 -- the attribute access is the point


def max_concurrent_tasks(sc) -> int:
    """Task slots the cluster offers now, as Spark's barrier scheduler counts them."""
    jsc = sc._jsc.sc()
    profile = jsc.resourceProfileManager().defaultResourceProfile()
    return int(jsc.maxNumConcurrentTasks(profile))


def stop_jvm_context(sc) -> None:
    """Stop ``sc``'s JVM SparkContext (executors released, the application ended) and nothing
    else: for a process that exits next, without pyspark's wait for its accumulator server."""
    sc._jsc.stop()


def submitted_conf():
    """spark-submit's properties as the JVM holds them (a ``SparkConf`` backed by the JVM's), so an
    edit to one of them starts from its real value instead of replacing it."""
    from pyspark import SparkConf, SparkContext

    SparkContext._ensure_initialized()
    return SparkConf()
