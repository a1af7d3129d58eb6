"""The tasks bench/operator_task.py times with `airflow tasks test`: the same trivial 2-rank allreduce
through our operator and through the apache-spark provider's SparkSubmitOperator running a script that
calls horovod.spark.run, plus a task that does nothing (what `airflow tasks test` itself costs).
The ``*_cluster`` tasks run on the standalone master of connection ``spark_bench_cluster`` (the
cluster section of bench/operator_task.py starts one): ours in client and cluster deploy mode
(followed, or deferred), and the peer in client mode, the only mode in which spark-submit runs a
Python application there."""

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
    for suffix, conn_id in (("", "spark_default"), ("_cluster", "spark_bench_cluster")):
        SparkSubmitOperator(task_id=f"peer_horovod_spark_run{suffix}",
                            application=str(BENCH / "peer_horovod_spark_run.py"), conn_id=conn_id,
                            name="peer-horovod-spark-run",
                            conf={"spark.pyspark.python": sys.executable,
                                  "spark.pyspark.driver.python": sys.executable, "spark.ui.enabled": "false"},
                            env_vars={"PATH": os.path.dirname(sys.executable) + os.pathsep +
                                      os.environ.get("PATH", "")})
    for task_id, deploy_mode, deferrable in (("ours_client_cluster", "client", False),
                                             ("ours_cluster", "cluster", False),
                                             ("ours_deferrable_cluster", "cluster", True)):
        HorovodRunnerOperator(task_id=task_id, python_callable=workloads.hvd_allreduce, np=2, launcher="gloo",
                              spark_conn_id="spark_bench_cluster", deploy_mode=deploy_mode, deferrable=deferrable)

    @task
    def nothing():
        return 1

    nothing()


hvd_bench_tasks()
