"""Test DAG: training on two real executors (Spark local-cluster), one of which the test kills;
max_restarts must carry the task through in its first try."""

from __future__ import annotations

import os

import pendulum
from airflow.sdk import dag

from airflow_provider_hvd.operators.horovod_runner import HorovodRunnerOperator

MARKERS = os.environ.get("HVD_TEST_MARKERS", "/tmp/hvd-executor-lost-markers")


def train_steps(marker_dir: str, steps: int = 40) -> dict:
    """Each rank marks its pid per attempt; rank 0 checkpoints every step; resumes after a restart."""
    import time

    import horovod.torch as hvd
    import torch

    from airflow_provider_hvd import checkpoint_dir, load_checkpoint, restart_number, resume_checkpoint, save_checkpoint

    hvd.init()
    resume = resume_checkpoint()
    start = int(load_checkpoint(resume)["step"]) if resume else 0
    marker = os.path.join(marker_dir, f"attempt-{restart_number()}-rank-{hvd.rank()}.pid")
    with open(marker + ".tmp", "w") as f:
        f.write(str(os.getpid()))
    os.replace(marker + ".tmp", marker)
    for step in range(start, steps):
        hvd.allreduce(torch.ones(2), name="grad")
        if hvd.rank() == 0:
            save_checkpoint({"step": step + 1}, checkpoint_dir(), step=step + 1)
        time.sleep(0.1)
    return {"attempt": restart_number(), "resumed_from_step": start, "resume": resume, "steps": steps}


@dag(schedule=None, start_date=pendulum.datetime(2026, 1, 1, tz="UTC"), catchup=False)
def hvd_executor_lost():
    HorovodRunnerOperator(task_id="train", python_callable=train_steps, np=2, op_kwargs={"marker_dir": MARKERS},
                          spark_conn_id="spark_local_cluster", launcher="gloo", max_restarts=2,
                          conf={"spark.executor.memory": "768m"})


hvd_executor_lost()
