"""Test DAG: two runs of it at once must not share storage prefixes, ports or ranks."""

from __future__ import annotations

import pendulum
from airflow.sdk import dag

from airflow_provider_hvd.operators.horovod_runner import HorovodRunnerOperator


def allreduce_and_say_where(marker):
    import os
    import time

    import horovod.torch as hvd
    import torch

    from airflow_provider_hvd import checkpoint_dir, save_checkpoint

    hvd.init()
    total = hvd.allreduce(torch.tensor([float(hvd.rank() + 1)]), op=hvd.Sum).item()
    save_checkpoint({"marker": marker}, checkpoint_dir(), step=1)
    time.sleep(5)  # keep both runs' ranks alive at the same time
    return {"sum": total, "marker": marker, "checkpoint_dir": checkpoint_dir(), "pid": os.getpid()}


@dag(schedule=None, start_date=pendulum.datetime(2026, 1, 1, tz="UTC"), catchup=False, params={"np": 2})
def hvd_concurrent_runs():
    # np templated, rendered as text ("2"): checked once rendered.
    HorovodRunnerOperator(task_id="train", python_callable=allreduce_and_say_where, np="{{ params.np }}",
                          op_kwargs={"marker": "{{ run_id }}"})


hvd_concurrent_runs()
