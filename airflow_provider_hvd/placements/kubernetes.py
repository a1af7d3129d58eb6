"""Kubernetes cluster mode: the driver runs in a pod; spark-submit waits for it."""

from __future__ import annotations

from typing import ClassVar

from airflow_provider_hvd.placements.base import ClusterPlacement, KeyDelivery
from airflow_provider_hvd.placements.try_files import TryFiles
from airflow_provider_hvd.runner.spark_app import SIGNING_KEY_ENV


class KubernetesCluster(ClusterPlacement):
    """The driver pod takes the key from a Kubernetes Secret
    (``spark.kubernetes.driver.secretKeyRef.HVD_SIGNING_KEY=<secret>:<key>``), named by the ``horovod``
    connection's ``kubernetes_secret`` field and holding the connection's key: a key made for one run
    cannot get there without a command line or a pod spec. The driver's environment goes as
    ``spark.kubernetes.driverEnv.*``."""

    gpu_vendor: ClassVar[str | None] = "nvidia.com"

    def check(self, files: TryFiles, deferrable: bool) -> None:
        if not self.settings.has_key:
            raise ValueError("deploy_mode 'cluster' on Kubernetes needs the horovod connection's signing key (its "
                             "password) and a Kubernetes Secret holding the same key: a key made for one run "
                             "cannot reach the driver pod without a command line. Set the password, create the "
                             "Secret (kubectl create secret generic hvd-signing-key --from-literal=key=<hex>) and "
                             "set the connection's kubernetes_secret field to hvd-signing-key:key.")
        secret = self.settings.kubernetes_secret
        if not secret or ":" not in secret:
            raise ValueError(f"deploy_mode 'cluster' on Kubernetes takes the signing key from a Kubernetes Secret: "
                             f"set the horovod connection's kubernetes_secret field to <secret name>:<key> (got "
                             f"{secret!r})")
        super().check(files, deferrable)

    def deliver_key(self, key: bytes, key_path: str, driver_env: dict[str, str]) -> KeyDelivery:
        conf = {f"spark.kubernetes.driverEnv.{name}": value for name, value in driver_env.items()}
        conf[f"spark.kubernetes.driver.secretKeyRef.{SIGNING_KEY_ENV}"] = str(self.settings.kubernetes_secret)
        return KeyDelivery(conf=conf)
