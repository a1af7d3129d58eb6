"""What the driver asks of the Spark cluster before a barrier stage: its kind, its free slots, its Python.

Barrier stages are all-or-nothing: Spark re-checks for ``np`` free slots every 15 s,
40 times, before failing, and does not support dynamic allocation at all. So the
driver checks both here, in seconds, and says what to change.
"""

from __future__ import annotations

import logging
import os
import re
import sys
import time

from airflow_provider_hvd.runner.driver.pyspark_internals import max_concurrent_tasks
from airflow_provider_hvd.runner.errors import ClusterCapacityError

log = logging.getLogger("airflow_provider_hvd.runner")

_announced: set[tuple[str, str]] = set()
# How often the wait for executors looks again. The barrier stage is submitted the moment the slots
# are there, so a coarser look is time every launch loses; a look is one local py4j call into the
# driver's JVM.
SLOT_POLL_S = 0.1


def executors_on_this_machine(master: str) -> bool:
    """``local``, ``local[...]`` and ``local-cluster[...]``: every executor runs on this machine
    (so the driver's own interpreter is a Python they can run)."""
    return master == "local" or master.startswith(("local[", "local-cluster["))


def single_jvm(master: str) -> bool:
    """``local`` and ``local[...]``: the driver's JVM runs the tasks, so its slots are all there
    is at once (no executor will register later). ``local-cluster`` has real executors."""
    return master == "local" or master.startswith("local[")


def worker_python(sc) -> str:
    """The Python executable the barrier tasks (and so the ranks) run.

    ``spark.pyspark.python`` when set: Spark documents it as the executors' Python, but a
    driver started as a plain Python process (a script, a notebook) ignores it; then
    ``PYSPARK_PYTHON`` as the SparkContext read it. With neither, on a master whose executors
    are all on this machine, the driver's own interpreter: Spark's default, ``python3`` from
    the PATH, is rarely the virtual environment the user installed this package into. On a
    real cluster nothing is overridden: its workers' Python is the cluster's to configure.
    """
    configured = sc.getConf().get("spark.pyspark.python")
    if configured:
        return configured
    if "PYSPARK_PYTHON" in os.environ or sc.pythonExec != "python3":
        return sc.pythonExec
    if executors_on_this_machine(sc.master):
        if (sc.master, sys.executable) not in _announced:
            _announced.add((sc.master, sys.executable))
            log.info("HorovodRunner: Spark master %s and neither spark.pyspark.python nor PYSPARK_PYTHON set: "
                     "the barrier tasks and ranks run this driver's Python, %s", sc.master, sys.executable)
        return sys.executable
    return sc.pythonExec


def check_cluster(sc, np: int, wait_s: float) -> None:
    """Fail in seconds, not Spark's ~10 minutes of retries, when the barrier stage cannot be scheduled."""
    conf = sc.getConf()
    if conf.get("spark.dynamicAllocation.enabled", "false").lower() == "true" and not single_jvm(sc.master):
        raise ClusterCapacityError(
            "HorovodRunner needs a fixed set of executors: Spark's barrier mode does not support dynamic "
            "allocation. Start this Spark application with spark.dynamicAllocation.enabled=false "
            "(and spark.executor.instances set) to run Horovod.")
    t0 = time.monotonic()
    deadline = t0 + (0 if single_jvm(sc.master) else wait_s)
    slots = max_concurrent_tasks(sc)
    told = None
    while slots < np and time.monotonic() < deadline:
        if told is None or time.monotonic() - told >= 5:  # the wait is visible, with what Spark has now
            told = time.monotonic()
            log.info("HorovodRunner: waiting for %d task slots; the cluster has %d (%.0f s of %g s)", np, slots,
                     told - t0, wait_s)
        time.sleep(SLOT_POLL_S)
        slots = max_concurrent_tasks(sc)
    if told is not None and slots >= np:
        log.info("HorovodRunner: %d task slots free after %.1f s", slots, time.monotonic() - t0)
    if slots < np:
        task_cpus = conf.get("spark.task.cpus", "1")
        raise ClusterCapacityError(
            f"HorovodRunner(np={np}) needs {np} task slots at once, but the Spark cluster ({sc.master}) has "
            f"{slots} (spark.task.cpus={task_cpus}). Use np<={max(slots, 1)}, add executors or cores "
            f"(spark.executor.instances, spark.executor.cores, or local[{np}]), or debug on the driver "
            f"with np=-{np}.")


def describe_master(sc) -> str:
    return re.sub(r"//[^@/]*@", "//", sc.master)  # never log credentials embedded in a master URL
