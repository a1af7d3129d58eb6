"""PySpark's Python worker daemon, with pyspark imported from its installation.

The application's executors start this module instead of ``pyspark.daemon``
(``spark.python.daemon.module``, set by spark_app unless the user set it): the daemon, and every
worker it forks (which imports ``pyspark.worker`` after the fork), would otherwise compile pyspark
from Spark's zip on each executor's way to its barrier task (common/installed_pyspark.py).
A worker whose Python lacks this package fails to start the daemon; driver/worker_diagnosis.py
names the missing package as the barrier task's own check would.
"""

from airflow_provider_hvd.runner.common.installed_pyspark import prefer_installed

if __name__ == "__main__":
    prefer_installed()
    from pyspark.daemon import manager

    manager()
