"""np > 0: the driver's side of the Spark barrier stage of np tasks, one rank per task slot.

The stage runs ``barrier/entry.checked_barrier_task`` in every task (shipped by value, so a
worker without this package still reports that clearly), under the worker Python that
``cluster.worker_python`` picked, in a background thread and a job group of its own, so
that the driver can cancel it the moment any rank fails. What each task does is
barrier/barrier_task.py.
"""

from __future__ import annotations

import functools
import threading
import uuid

from airflow_provider_hvd.runner.driver import pyspark_internals
from airflow_provider_hvd.runner.barrier import entry
from airflow_provider_hvd.runner.wire.launch import TaskSpec


def stage_function(spec: TaskSpec, required_modules: list[str]) -> functools.partial:
    """What Spark ships to every barrier task: the by-value entry point and plain data only, so
    that a worker without this package can still load it and say so."""
    entry.ship_by_value()
    return functools.partial(entry.checked_barrier_task, spec.to_fields(), list(required_modules))


class BarrierJob:
    """The barrier stage, collected in a background thread under a job group of its own."""

    def __init__(self, sc, np: int, spec: TaskSpec, description: str, *, python: str,
                 required_modules: list[str] = ()):
        """``python``: the executable every task runs (``cluster.worker_python``); ``required_modules``:
        what each task looks up before starting a rank (dependencies.py)."""
        self._sc = sc
        self._np = np
        self._spec = spec
        self._python = python
        self._required = list(required_modules)
        self.group = f"horovod-runner-{uuid.uuid4().hex[:12]}"
        self._description = description
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._collect, name="hvd-barrier-job", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _collect(self) -> None:
        try:
            self._sc.setJobGroup(self.group, self._description, interruptOnCancel=True)
            task = stage_function(self._spec, self._required)
            rdd = self._sc.parallelize(range(self._np), self._np).barrier().mapPartitions(task)
            with pyspark_internals.python_exec(self._sc, self._python):
                pyspark_internals.wrap_python_function(rdd)
            rdd.collect()
        except BaseException as exc:  # Py4JJavaError and friends: reported through error()
            self._error = exc

    def error(self) -> BaseException | None:
        return self._error if not self._thread.is_alive() else None

    def join(self, timeout: float) -> bool:
        """Wait for the stage to end on its own; True when it did."""
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def stop(self, timeout: float = 30.0) -> None:
        if self._thread.is_alive():
            self._sc.cancelJobGroup(self.group)
        self._thread.join(timeout)
