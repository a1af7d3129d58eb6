"""YARN cluster mode: the driver is YARN's application master; spark-submit waits for it."""

from __future__ import annotations

from airflow_provider_hvd.placements.base import ClusterPlacement, KeyDelivery
from airflow_provider_hvd.placements.signing_key import KEY_FILE_NAME
from airflow_provider_hvd.runner.spark_app import SIGNING_KEY_FILE_ENV


class YarnCluster(ClusterPlacement):
    """The key file travels with ``--files`` (YARN's distributed cache, through the application's staging
    directory, private to its user and removed when the application ends); the driver's environment goes
    as ``spark.yarn.appMasterEnv.*``. YARN maps the ``gpu`` resource to yarn.io/gpu itself."""

    def deliver_key(self, key: bytes, key_path: str, driver_env: dict[str, str]) -> KeyDelivery:
        conf = {f"spark.yarn.appMasterEnv.{name}": value for name, value in driver_env.items()}
        conf[f"spark.yarn.appMasterEnv.{SIGNING_KEY_FILE_ENV}"] = KEY_FILE_NAME
        return KeyDelivery(conf=conf, files=[f"{key_path}#{KEY_FILE_NAME}"])
