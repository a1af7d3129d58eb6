"""Smoke DAG: the runner core used directly from a TaskFlow task.

A 2-rank Horovod allreduce as subprocesses of the Airflow worker (``np=-2``), no
Spark application needed. It proves that ranks start, rendezvous and return rank
0's value inside an Airflow task, with every rank's log lines in the task log.
"""

from __future__ import annotations

import pendulum
from airflow.sdk import dag, task


def allreduce_ranks():
    import horovod.torch as hvd
    import torch

    from airflow_provider_hvd import log_to_driver

    hvd.init()
    total = hvd.allreduce(torch.tensor([float(hvd.rank() + 1)]), op=hvd.Sum).item()
    log_to_driver(f"rank {hvd.rank()} of {hvd.size()}: allreduce sum = {total}")
    return {"size": hvd.size(), "sum": total}


@dag(schedule=None, start_date=pendulum.datetime(2026, 1, 1, tz="UTC"), catchup=False,
     tags=["horovod", "example"])
def hvd_allreduce_smoke():
    @task
    def allreduce() -> dict:
        from airflow_provider_hvd import HorovodRunner

        result = HorovodRunner(np=-2).run(allreduce_ranks)
        if result != {"size": 2, "sum": 3.0}:
            raise ValueError(f"unexpected allreduce result {result}")
        return result

    allreduce()


hvd_allreduce_smoke()
