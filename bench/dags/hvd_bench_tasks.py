"""The tasks bench/operator_task.py times with `airflow tasks test`: the same trivial 2-rank allreduce
through our operator and through the apache-spark provider's SparkSubmitOperator running a script that
calls horovod.spark.run, plus a task that does nothing (what `airflow tasks test` itself costs)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pendulum
from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.sdk import dag, task

BENCH = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(BENCH))

import workloads  # noqa: E402

from airflow_provider_hvd.operators.horovod_runner import HorovodRunnerOperator  # noqa: E402


@dag(schedule=None, start_date=pendulum.datetime(2026, 1, 1, tz="UTC"), catchup=False)
def hvd_bench_tasks():
    HorovodRunnerOperator(task_id="ours_client", python_callable=workloads.hvd_allreduce, np=2, launcher="gloo")
    SparkSubmitOperator(task_id="peer_horovod_spark_run", application=str(BENCH / "peer_horovod_spark_run.py"),
                        conn_id="spark_default", name="peer-horovod-spark-run",
                        conf={"spark.pyspark.python": sys.executable, "spark.pyspark.driver.python": sys.executable,
                              "spark.ui.enabled": "false"},
                        env_vars={"PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")})

    @task
    def nothing():
        return 1

    nothing()


hvd_bench_tasks()
