"""Test DAG: the first try checkpoints and dies; the retry must resume from that checkpoint."""

from __future__ import annotations

import pendulum
from airflow.sdk import dag

from airflow_provider_hvd.operators.horovod_runner import HorovodRunnerOperator


def train_or_die():
    import horovod.torch as hvd

    from airflow_provider_hvd import checkpoint_dir, load_checkpoint, resume_checkpoint, save_checkpoint

    hvd.init()
    resume = resume_checkpoint()
    if resume is None:
        save_checkpoint({"step": 7}, checkpoint_dir(), step=7)
        hvd.allreduce_(__import__("torch").ones(1), name="sync")  # rank 0 has written it
        raise RuntimeError("first try dies after its checkpoint")
    return {"resumed_from_step": int(load_checkpoint(resume)["step"]), "resume": resume}


@dag(schedule=None, start_date=pendulum.datetime(2026, 1, 1, tz="UTC"), catchup=False)
def hvd_retry_resume():
    HorovodRunnerOperator(task_id="train", python_callable=train_or_die, np=-2, retries=1,
                          retry_delay=pendulum.duration(seconds=0), resume_from_checkpoint=True)


hvd_retry_resume()
