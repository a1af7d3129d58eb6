"""One barrier task on an executor: join the roster, then start this task's rank (gloo) or serve mpirun (mpi).

Each barrier task sends its executor's address (SPARK_LOCAL_IP where the cluster
sets it, else ``getTaskInfos()``) to the driver's roster and gets every task's
back (one round trip, where Spark's ``allGather`` costs a second), derives the
whole host-by-host rank assignment from that list (the same in every task), and
starts its own rank with gloo, whose rendezvous goes through its launcher to the
driver service (rendezvous_proxy.py). Under mpi, the task holding rank 0 runs
mpirun and every task serves mpirun's rsh agent until the driver releases it.

Reached through entry.checked_barrier_task, once the worker's Python is known to run a
rank; the driver's side of the stage is driver/barrier_job.py.
"""

from __future__ import annotations

import json
import os
import socket

from airflow_provider_hvd.runner.wire.launch import LaunchEnv, TaskSpec
from airflow_provider_hvd.runner.wire.messages import TaskInfo


def run_barrier_task(spec: TaskSpec, _rows):
    """Body of each barrier task, once entry.checked_barrier_task has found its Python able
    to run a rank (runs in the executor's Python worker)."""
    from pyspark import BarrierTaskContext

    from airflow_provider_hvd.runner.barrier.gpus import task_gpu_addresses

    ctx = BarrierTaskContext.get()
    if spec.launcher == "mpi":
        yield from _mpi_task(spec, ctx)
        return
    from airflow_provider_hvd.runner.common.rank_slots import assign_slots, gloo_env
    from airflow_provider_hvd.runner.barrier.addresses import gloo_interface
    from airflow_provider_hvd.runner.barrier.rank_environment import rank_base_env
    from airflow_provider_hvd.runner.barrier.rank_process import RankProcess
    from airflow_provider_hvd.runner.barrier.roster_member import RosterMember

    member = RosterMember((spec.driver_host, spec.driver_port), bytes.fromhex(spec.secret_hex),
                          ctx.partitionId(), TaskInfo(host=executor_host(ctx), hostname=socket.gethostname()))
    try:
        task_hosts = [t.host for t in member.tasks()]
        slot = assign_slots(task_hosts)[ctx.partitionId()]
        iface = gloo_interface(slot.hostname, spec.driver_host)
        env = {**rank_base_env(), **spec.env, **gloo_env(slot, iface=iface)}
        gpus = task_gpu_addresses(ctx)
        if gpus is not None:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(gpus)
        rank = RankProcess(rank=slot.rank, host=slot.hostname, env=env,
                           driver=(spec.driver_host, spec.driver_port), secret=bytes.fromhex(spec.secret_hex),
                           forward_output=spec.forward_output, timeline_interval=spec.timeline_interval)
        rank.start()
        member.watch(rank.stop_by_driver)  # the driver gone or cut off: the rank goes too
        returncode = rank.wait()
    finally:
        member.leave()
    if returncode != 0:
        # Failing the task fails the stage, so Spark stops the other tasks too.
        raise RuntimeError(f"Horovod rank {slot.rank} on {slot.hostname} exited with code {returncode}")
    yield slot.rank


def _mpi_task(spec: TaskSpec, ctx):
    """Every task serves mpirun's rsh agent for its host; the task that holds rank 0 runs mpirun.
    Every task keeps serving until the driver releases it (the run is over), so no host's
    service closes while mpirun still needs it."""
    from airflow_provider_hvd.runner.barrier.gpus import task_gpu_addresses
    from airflow_provider_hvd.runner.common.rank_slots import assign_slots
    from airflow_provider_hvd.runner.barrier.roster_member import RosterMember
    from airflow_provider_hvd.runner.barrier.rsh_service import RshService

    secret = bytes.fromhex(spec.secret_hex)
    service = RshService(secret)
    member = None
    try:
        gpus = task_gpu_addresses(ctx)
        mine = TaskInfo(host=executor_host(ctx), hostname=socket.gethostname(), rsh_port=service.port,
                        gpus=",".join(gpus) if gpus else None)
        member = RosterMember((spec.driver_host, spec.driver_port), secret, ctx.partitionId(), mine)
        tasks = member.tasks()
        slots = assign_slots([t.host for t in tasks])
        slot = slots[ctx.partitionId()]
        if slot.rank == 0:
            _run_mpirun(spec, member, tasks, slots, slot)
        else:
            member.wait_for_stop()
        yield slot.rank
    finally:
        if member is not None:
            member.leave()
        service.close()


def _run_mpirun(spec: TaskSpec, member, tasks: list[TaskInfo], slots, slot) -> None:
    """Rank 0's task: mpirun over every host's rsh service, until it ends and the driver releases us."""
    from airflow_provider_hvd.runner.barrier.addresses import gloo_interface
    from airflow_provider_hvd.runner.barrier.mpi_run import MpiRun
    from airflow_provider_hvd.runner.barrier.rank_environment import rank_base_env

    hosts: list[tuple[str, int]] = []  # (hostname, ranks there), in rank order
    for s in sorted(slots, key=lambda s: s.rank):
        if not hosts or hosts[-1][0] != s.hostname:
            hosts.append((s.hostname, 0))
        hosts[-1] = (s.hostname, hosts[-1][1] + 1)
    gpus_by_rank = [None] * len(slots)
    for task, s in zip(tasks, slots):
        gpus_by_rank[s.rank] = task.gpus
    rank_env = dict(spec.env)
    if any(g is not None for g in gpus_by_rank):
        rank_env[LaunchEnv.GPUS_BY_RANK] = json.dumps(gpus_by_rank)
    secret = bytes.fromhex(spec.secret_hex)
    run = MpiRun(hosts=hosts, rsh={t.host: (t.host, t.rsh_port) for t in tasks},
                 iface=gloo_interface(slot.hostname, spec.driver_host), env=rank_base_env(),
                 rank_env=rank_env, driver=(spec.driver_host, spec.driver_port), secret=secret,
                 forward_output=spec.forward_output, timeline_interval=spec.timeline_interval,
                 extra_args=list(spec.mpi_args))
    run.start()
    released = member.watch(run.stop)  # the driver gone or cut off: mpirun's job goes too
    returncode = run.wait()
    if returncode != 0:
        raise RuntimeError(f"mpirun exited with code {returncode}")
    released.wait()


def executor_host(ctx) -> str:
    """This task's host as Spark's executor knows itself: SPARK_LOCAL_IP when the
    cluster sets it (the address the executor binds to), else the address the
    driver sees in getTaskInfos(). Shared with every task through the roster, so
    each task sees every task's own answer."""
    return os.environ.get("SPARK_LOCAL_IP") or ctx.getTaskInfos()[ctx.partitionId()].address.rsplit(":", 1)[0]
