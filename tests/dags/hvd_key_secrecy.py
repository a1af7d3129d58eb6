"""Test DAG: a short training whose signing key must show up in no command line, environment, log,
event log or Spark UI (tests/test_key_secrecy.py); also submitted to YARN (tests/test_deploy_modes.py) and
killed mid-run in standalone cluster mode (tests/test_cluster_mode.py). ``hvd_reattach``: the same training with
one retry, whose try 1 loses its Airflow worker mid-training (tests/test_cluster_mode.py)."""

from __future__ import annotations

import json
import os
from datetime import timedelta

import pendulum
from airflow.sdk import dag

from airflow_provider_hvd.operators.horovod_runner import HorovodRunnerOperator


def allreduce_for_a_while(marker_dir, seconds=6.0, release=None):
    import os
    import pathlib
    import time

    import horovod.torch as hvd
    import torch

    hvd.init()
    pathlib.Path(marker_dir, f"rank-{hvd.rank()}.pid").write_text(str(os.getpid()))
    steps, end = 0, time.monotonic() + seconds
    # Long enough for the test to read every process and the Spark UI; or, with ``release``, until the
    # test has seen what it waits for and creates that file (``seconds`` then only bounds it). The ranks
    # agree on when to stop (the minimum of their "go on" flags): a rank stopping by its own clock left
    # the other in an allreduce with nobody ("Horovod has been shut down", once in a clean-clone run).
    def go_on():
        return time.monotonic() < end and not (release and os.path.exists(release))

    while hvd.allreduce(torch.tensor([float(go_on())]), op=hvd.Min).item():
        hvd.allreduce(torch.ones(4), op=hvd.Sum)
        steps += 1
        time.sleep(0.1)
    print(f"rank {hvd.rank()} did {steps} steps", flush=True)
    return {"size": hvd.size(), "steps": steps}


@dag(schedule=None, start_date=pendulum.datetime(2026, 1, 1, tz="UTC"), catchup=False)
def hvd_key_secrecy():
    HorovodRunnerOperator(
        task_id="train", python_callable=allreduce_for_a_while, np=int(os.environ.get("HVD_TEST_NP", "2")),
        slot_wait_timeout=os.environ.get("HVD_TEST_SLOT_WAIT") or None,
        op_kwargs={"marker_dir": os.environ.get("HVD_TEST_MARKERS", "/tmp"),
                   "seconds": float(os.environ.get("HVD_TEST_SECONDS", "6")),
                   "release": os.environ.get("HVD_TEST_RELEASE")},
        spark_conn_id=os.environ.get("HVD_TEST_SPARK_CONN", "spark_default"),
        deploy_mode=os.environ.get("HVD_TEST_DEPLOY_MODE") or None,
        deferrable=os.environ.get("HVD_TEST_DEFERRABLE") == "1",
        gpus_per_executor=int(os.environ.get("HVD_TEST_GPUS_PER_EXECUTOR", "0")) or None,
        gpu_discovery_script=os.environ.get("HVD_TEST_GPU_DISCOVERY") or None,
        # Spark's own records of the run, searched for the key afterwards.
        # Uncompressed, so that a search can find the key if it were there.
        conf={"spark.eventLog.enabled": "true", "spark.eventLog.compress": "false",
              "spark.eventLog.dir": os.environ.get("HVD_TEST_EVENT_LOG", "file:///tmp/spark-events"),
              **json.loads(os.environ.get("HVD_TEST_CONF", "{}"))})


hvd_key_secrecy()


@dag(schedule=None, start_date=pendulum.datetime(2026, 1, 1, tz="UTC"), catchup=False)
def hvd_reattach():
    """Never deferred: the driver is followed from the task's own process, which the test kills."""
    HorovodRunnerOperator(
        task_id="train", python_callable=allreduce_for_a_while, np=2, retries=1, retry_delay=timedelta(seconds=1),
        op_kwargs={"marker_dir": os.environ.get("HVD_TEST_MARKERS", "/tmp"),
                   "seconds": float(os.environ.get("HVD_TEST_SECONDS", "6")),
                   "release": os.environ.get("HVD_TEST_RELEASE")},
        spark_conn_id=os.environ.get("HVD_TEST_SPARK_CONN", "spark_default"),
        deploy_mode=os.environ.get("HVD_TEST_DEPLOY_MODE") or None, deferrable=False)


hvd_reattach()
