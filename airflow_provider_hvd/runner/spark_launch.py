"""np > 0: one Spark barrier stage of np tasks, one rank per task slot.

Each barrier task sends its executor's address (SPARK_LOCAL_IP where the cluster
sets it, else ``getTaskInfos()``) to the driver's roster and gets every task's
back (roster.py: one round trip, where Spark's ``allGather`` costs a second),
derives the whole host-by-host rank assignment from that list (the same in
every task), and starts its own rank with gloo, whose rendezvous goes through
its launcher to the driver service (rendezvous.py). Under mpi, the task holding rank 0 runs
mpirun and every task serves mpirun's rsh agent until the driver releases it. The stage
runs in a background thread under its own job group so that the driver can
cancel it the moment any rank fails.

Before any of that, every task checks that its Python can run a rank (worker_check.py), and
the stage runs under the Python ``worker_python`` picks: on a ``local[...]`` /
``local-cluster[...]`` master with no Python configured, the driver's own interpreter.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import logging
import os
import re
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Iterator

from airflow_provider_hvd.runner import worker_check
from airflow_provider_hvd.runner.errors import ClusterCapacityError

log = logging.getLogger("airflow_provider_hvd.runner")


@dataclass(frozen=True)
class TaskSpec:
    """Everything a barrier task needs; small, since Spark ships it with every task."""
    driver_host: str
    driver_port: int
    secret_hex: str
    forward_output: bool
    env: dict[str, str] = field(default_factory=dict)
    timeline_interval: float | None = None
    launcher: str = "gloo"
    mpi_args: tuple[str, ...] = ()


def run_barrier_task(spec: TaskSpec, _rows):
    """Body of each barrier task, once worker_check.checked_barrier_task has found its Python able
    to run a rank (runs in the executor's Python worker)."""
    from pyspark import BarrierTaskContext

    from airflow_provider_hvd.runner.gpus import task_gpu_addresses

    ctx = BarrierTaskContext.get()
    if spec.launcher == "mpi":
        yield from _mpi_task(spec, ctx)
        return
    from airflow_provider_hvd.runner.network import gloo_interface
    from airflow_provider_hvd.runner.rank_process import RankProcess
    from airflow_provider_hvd.runner.roster import RosterMember
    from airflow_provider_hvd.runner.topology import assign_slots, gloo_env

    member = RosterMember((spec.driver_host, spec.driver_port), bytes.fromhex(spec.secret_hex),
                          ctx.partitionId(), {"host": executor_host(ctx)})
    try:
        task_hosts = [t["host"] for t in member.tasks()]
    finally:
        member.leave()
    slot = assign_slots(task_hosts)[ctx.partitionId()]
    iface = gloo_interface(slot.hostname, spec.driver_host)
    env = {**os.environ, **spec.env,
           **gloo_env(slot, iface=iface)}
    gpus = task_gpu_addresses(ctx)
    if gpus is not None:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(gpus)
    rank = RankProcess(rank=slot.rank, host=slot.hostname, env=env, driver=(spec.driver_host, spec.driver_port),
                       secret=bytes.fromhex(spec.secret_hex), forward_output=spec.forward_output,
                       timeline_interval=spec.timeline_interval)
    rank.start()
    returncode = rank.wait()
    if returncode != 0:
        # Failing the task fails the stage, so Spark stops the other tasks too.
        raise RuntimeError(f"Horovod rank {slot.rank} on {slot.hostname} exited with code {returncode}")
    yield slot.rank


def _mpi_task(spec: TaskSpec, ctx):
    """Every task serves mpirun's rsh agent for its host; the task that holds rank 0 runs mpirun.
    Every task keeps serving until the driver releases it (the run is over), so no host's
    service closes while mpirun still needs it."""
    from airflow_provider_hvd.runner.gpus import task_gpu_addresses
    from airflow_provider_hvd.runner.mpi_launch import GPUS_BY_RANK_ENV, MpiRun, RshService
    from airflow_provider_hvd.runner.network import gloo_interface
    from airflow_provider_hvd.runner.roster import RosterMember
    from airflow_provider_hvd.runner.topology import assign_slots

    secret = bytes.fromhex(spec.secret_hex)
    service = RshService(secret)
    member = None
    try:
        gpus = task_gpu_addresses(ctx)
        mine = {"host": executor_host(ctx), "rsh_port": service.port, "gpus": ",".join(gpus) if gpus else None}
        member = RosterMember((spec.driver_host, spec.driver_port), secret, ctx.partitionId(), mine)
        tasks = member.tasks()
        slots = assign_slots([t["host"] for t in tasks])
        slot = slots[ctx.partitionId()]
        if slot.rank == 0:
            hosts: list[tuple[str, int]] = []
            for s in sorted(slots, key=lambda s: s.rank):
                if not hosts or hosts[-1][0] != s.hostname:
                    hosts.append((s.hostname, 0))
                hosts[-1] = (s.hostname, hosts[-1][1] + 1)
            gpus_by_rank = [None] * len(slots)
            for task, s in zip(tasks, slots):
                gpus_by_rank[s.rank] = task["gpus"]
            rank_env = dict(spec.env)
            if any(g is not None for g in gpus_by_rank):
                rank_env[GPUS_BY_RANK_ENV] = json.dumps(gpus_by_rank)
            run = MpiRun(hosts=hosts, rsh={t["host"]: (t["host"], t["rsh_port"]) for t in tasks},
                         iface=gloo_interface(slot.hostname, spec.driver_host), env=dict(os.environ),
                         rank_env=rank_env, driver=(spec.driver_host, spec.driver_port), secret=secret,
                         forward_output=spec.forward_output, timeline_interval=spec.timeline_interval,
                         extra_args=list(spec.mpi_args))
            run.start()
            returncode = run.wait()
            if returncode != 0:
                raise RuntimeError(f"mpirun exited with code {returncode}")
        member.wait_for_stop()
        yield slot.rank
    finally:
        if member is not None:
            member.leave()
        service.close()


def executor_host(ctx) -> str:
    """This task's host as Spark's executor knows itself: SPARK_LOCAL_IP when the
    cluster sets it (the address the executor binds to), else the address the
    driver sees in getTaskInfos(). Shared with every task through the roster, so
    each task sees every task's own answer."""
    return os.environ.get("SPARK_LOCAL_IP") or ctx.getTaskInfos()[ctx.partitionId()].address.rsplit(":", 1)[0]


class BarrierJob:
    """The barrier stage, collected in a background thread under a job group of its own."""

    def __init__(self, sc, np: int, spec: TaskSpec, description: str, *, python: str,
                 required_modules: list[str] = ()):
        """``python``: the executable every task runs (``worker_python``); ``required_modules``:
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
            worker_check.ship_by_value()
            task = functools.partial(worker_check.checked_barrier_task, dataclasses.asdict(self._spec),
                                     self._required)
            rdd = self._sc.parallelize(range(self._np), self._np).barrier().mapPartitions(task)
            with _python_exec(self._sc, self._python):
                rdd._jrdd  # the worker's Python is fixed when pyspark wraps the function, here
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


_EXEC_LOCK = threading.Lock()
_announced: set[tuple[str, str]] = set()


def is_local_master(master: str) -> bool:
    """``local``, ``local[...]`` and ``local-cluster[...]``: every executor is on this machine."""
    return master == "local" or master.startswith(("local[", "local-cluster["))


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
    if is_local_master(sc.master):
        if (sc.master, sys.executable) not in _announced:
            _announced.add((sc.master, sys.executable))
            log.info("HorovodRunner: Spark master %s and neither spark.pyspark.python nor PYSPARK_PYTHON set: "
                     "the barrier tasks and ranks run this driver's Python, %s", sc.master, sys.executable)
        return sys.executable
    return sc.pythonExec


@contextlib.contextmanager
def _python_exec(sc, python: str) -> Iterator[None]:
    """``sc.pythonExec`` set to ``python`` for one RDD's wrapping only: the user's other jobs keep theirs."""
    with _EXEC_LOCK:
        before = sc.pythonExec
        sc.pythonExec = python
        try:
            yield
        finally:
            sc.pythonExec = before


def available_slots(sc) -> int:
    """Task slots the cluster offers now: Spark's own count for barrier stages."""
    jsc = sc._jsc.sc()
    profile = jsc.resourceProfileManager().defaultResourceProfile()
    return int(jsc.maxNumConcurrentTasks(profile))


def check_cluster(sc, np: int, wait_s: float) -> None:
    """Fail in seconds, not Spark's ~10 minutes of retries, when the barrier stage cannot be scheduled."""
    conf = sc.getConf()
    is_local = sc.master == "local" or sc.master.startswith("local[")  # local-cluster is a real cluster
    if conf.get("spark.dynamicAllocation.enabled", "false").lower() == "true" and not is_local:
        raise ClusterCapacityError(
            "HorovodRunner needs a fixed set of executors: Spark's barrier mode does not support dynamic "
            "allocation. Start this Spark application with spark.dynamicAllocation.enabled=false "
            "(and spark.executor.instances set) to run Horovod.")
    deadline = time.monotonic() + (0 if is_local else wait_s)
    slots = available_slots(sc)
    while slots < np and time.monotonic() < deadline:
        time.sleep(0.5)
        slots = available_slots(sc)
    if slots < np:
        task_cpus = conf.get("spark.task.cpus", "1")
        raise ClusterCapacityError(
            f"HorovodRunner(np={np}) needs {np} task slots at once, but the Spark cluster ({sc.master}) has "
            f"{slots} (spark.task.cpus={task_cpus}). Use np<={max(slots, 1)}, add executors or cores "
            f"(spark.executor.instances, spark.executor.cores, or local[{np}]), or debug on the driver "
            f"with np=-{np}.")


def describe_master(sc) -> str:
    return re.sub(r"//[^@/]*@", "//", sc.master)  # never log credentials embedded in a master URL
