"""np < 0: ``-np`` ranks as subprocesses of the driver, no Spark job (debugging, as in HorovodRunner).

The driver plays the barrier task's part here: it runs the task layer's launchers
(RankProcess per rank, or one MpiRun) in its own threads, for host ``localhost``."""

from __future__ import annotations

import json
import os
import threading

from airflow_provider_hvd.runner.common.rank_slots import assign_slots, gloo_env
from airflow_provider_hvd.runner.barrier.gpus import driver_gpus, local_rank_gpu
from airflow_provider_hvd.runner.barrier.mpi_run import MpiRun
from airflow_provider_hvd.runner.barrier.rank_environment import rank_base_env
from airflow_provider_hvd.runner.barrier.rank_process import RankProcess
from airflow_provider_hvd.runner.wire.launch import LaunchEnv

LOCAL_HOST = "127.0.0.1"


class LocalRanks:
    def __init__(self, n: int, *, secret: bytes, driver_port: int,
                 env: dict[str, str], forward_output: bool, timeline_interval: float | None = None):
        threads_each = str(max(1, (os.cpu_count() or 1) // n))
        gpus = driver_gpus()
        self.ranks: list[RankProcess] = []
        for slot in assign_slots(["localhost"] * n):
            rank_env = {**rank_base_env(), "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", threads_each),
                        **env,
                        **gloo_env(slot, iface="lo")}
            if gpus:
                rank_env["CUDA_VISIBLE_DEVICES"] = local_rank_gpu(gpus, slot.local_rank)
            self.ranks.append(RankProcess(rank=slot.rank, host="localhost", env=rank_env,
                                          driver=(LOCAL_HOST, driver_port), secret=secret,
                                          forward_output=forward_output, timeline_interval=timeline_interval))
        self._waiters: list[threading.Thread] = []

    def start(self) -> None:
        # Spawned from the caller's thread: ranks die with it (PR_SET_PDEATHSIG), not with a helper thread.
        for rank in self.ranks:
            rank.start()
            waiter = threading.Thread(target=rank.wait, name=f"hvd-local-rank{rank.rank}-wait", daemon=True)
            waiter.start()
            self._waiters.append(waiter)

    def stop(self) -> None:
        for rank in self.ranks:
            rank.kill()
        for waiter in self._waiters:
            waiter.join(10)


class LocalMpiRun:
    """np < 0 with launcher="mpi": one mpirun on the driver for all ranks."""

    def __init__(self, n: int, *, secret: bytes, driver_port: int, env: dict[str, str], forward_output: bool,
                 timeline_interval: float | None, mpi_args: tuple[str, ...]):
        gpus = driver_gpus()
        if gpus:  # one host: local rank == rank
            env = {**env, LaunchEnv.GPUS_BY_RANK: json.dumps([local_rank_gpu(gpus, r) for r in range(n)])}
        self._run = MpiRun(hosts=[("localhost", n)], rsh={}, iface="lo", env=rank_base_env(), rank_env=env,
                           driver=(LOCAL_HOST, driver_port), secret=secret, forward_output=forward_output,
                           timeline_interval=timeline_interval, extra_args=list(mpi_args))
        self._waiter: threading.Thread | None = None

    def start(self) -> None:
        self._run.start()
        self._waiter = threading.Thread(target=self._run.wait, name="hvd-local-mpirun-wait", daemon=True)
        self._waiter.start()

    def stop(self) -> None:
        self._run.stop()
        if self._waiter is not None:
            self._waiter.join(10)
