"""A DAG of a user's own, from a second DAG folder (a DAG bundle of its own, as a team's repository
would be): the platform's dags/ and this one are served side by side by one Airflow."""

from __future__ import annotations

import pendulum
from airflow.sdk import dag

from airflow_provider_hvd.operators.horovod_runner import HorovodRunnerOperator


def allreduce_hosts():
    import socket

    import horovod.torch as hvd
    import torch

    hvd.init()
    total = hvd.allreduce(torch.tensor([float(hvd.rank() + 1)]), op=hvd.Sum).item()
    return {"size": hvd.size(), "sum": total, "host": socket.gethostname()}


@dag(schedule=None, start_date=pendulum.datetime(2026, 1, 1, tz="UTC"), catchup=False, tags=["team"])
def team_smoke():
    HorovodRunnerOperator(task_id="allreduce", python_callable=allreduce_hosts, np=2)


team_smoke()
