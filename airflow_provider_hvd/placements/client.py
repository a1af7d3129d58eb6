"""Client mode: the Spark driver is spark-submit's child, in this Airflow task, on any master."""

from __future__ import annotations

import importlib.util
import os
import sys
from typing import ClassVar

from airflow_provider_hvd.placements import spark_conf
from airflow_provider_hvd.placements.base import Application, KeyDelivery, Placement
from airflow_provider_hvd.runner import spark_app


def _trains_here() -> bool:
    """Whether this interpreter can run the ranks itself (the all-in-one environment of a laptop or CI)."""
    return importlib.util.find_spec("horovod") is not None


class ClientMode(Placement):
    """``local[...]``, ``spark://``, ``yarn`` or ``k8s://`` in client mode. The driver ends with this
    task (spark_app._end_with_owner), and spark-submit returns when training has ended."""

    def all_in_one(self) -> bool:
        """One environment for Airflow and training on one machine (a laptop, CI): the driver and its
        workers use this interpreter and find its tools (mpirun's helpers) first."""
        return self.master.startswith("local") and _trains_here()

    def driver_env(self, app: Application) -> dict[str, str]:
        env = {**super().driver_env(app), spark_app.OWNER_PID_ENV: str(os.getpid())}
        if self.all_in_one():
            env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")
        return env

    def deliver_key(self, key: bytes, key_path: str, driver_env: dict[str, str]) -> KeyDelivery:
        return KeyDelivery(submit_env={**driver_env, spark_app.SIGNING_KEY_FILE_ENV: key_path})

    def spark_conf(self, app: Application, delivery: KeyDelivery) -> dict[str, str]:
        conf = spark_conf.quiet_driver_log(super().spark_conf(app, delivery), spark_app.LOG4J2_CONFIG)
        if self.all_in_one() and not os.environ.get("PYSPARK_PYTHON"):
            # Where the Airflow image has no horovod, Spark's own settings choose instead.
            conf.setdefault("spark.pyspark.python", sys.executable)
        return conf


class KubernetesClientMode(ClientMode):
    """Client mode on Kubernetes: executors ask the device plugin for GPUs by its resource name."""

    gpu_vendor: ClassVar[str | None] = "nvidia.com"
