"""Test DAG: rank 0 returns what JSON cannot hold; a downstream task reads it with load_result."""

from __future__ import annotations

import pendulum
from airflow.sdk import dag, task

from airflow_provider_hvd.operators.horovod_runner import HorovodRunnerOperator



def averaged_weights() -> dict:
    """A numpy array: not JSON."""
    import horovod.torch as hvd
    import numpy as np
    import torch

    hvd.init()
    weights = hvd.allreduce(torch.arange(4.0) * (hvd.rank() + 1), op=hvd.Average).numpy()
    return {"weights": weights.astype(np.float64)}


@dag(schedule=None, start_date=pendulum.datetime(2026, 1, 1, tz="UTC"), catchup=False)
def hvd_result_downstream():
    train = HorovodRunnerOperator(task_id="train", python_callable=averaged_weights, np=2, launcher="gloo")

    @task
    def evaluate(result_uri: str) -> dict:
        from airflow_provider_hvd.hooks.horovod import load_result

        value = load_result(result_uri)
        return {"type": type(value["weights"]).__name__, "weights": value["weights"].tolist()}

    evaluate(train.output)


hvd_result_downstream()
