"""Placement: one way the Spark application runs, as seen from the Airflow task that starts it.

Each placement plans spark-submit for its way (Spark conf, how the signing key and the driver's
environment reach the driver, its checks), submits through the task's one HorovodSparkSubmitHook,
follows the application until it ends, and kills it. Subclasses say only what differs.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from airflow_provider_hvd.hooks.spark_submit import HorovodSparkSubmitHook, SparkLaunch
from airflow_provider_hvd.placements import signing_key, spark_conf
from airflow_provider_hvd.placements.try_files import TryFiles
from airflow_provider_hvd.runner import spark_app

if TYPE_CHECKING:
    from airflow.triggers.base import BaseTrigger

    from airflow_provider_hvd.hooks.horovod import HorovodHook

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ConnectionSettings:
    """What the ``horovod`` connection says that a placement needs."""

    has_key: bool
    kubernetes_secret: str | None = None
    cluster_spark_app: str | None = None
    cluster_spark_jar: str | None = None

    @classmethod
    def of(cls, hook: HorovodHook) -> ConnectionSettings:
        return cls(has_key=hook.has_signing_key(), kubernetes_secret=hook.setting("kubernetes_secret", None),
                   cluster_spark_app=hook.setting("cluster_spark_app", None),
                   cluster_spark_jar=hook.setting("cluster_spark_jar", None))


@dataclass(frozen=True)
class Application:
    """What the operator asks a placement to run: spark_app.py's arguments, the ranks' environment."""

    args: list[str]
    rank_env: dict[str, str]
    name: str
    files: TryFiles
    conf: dict[str, Any] = field(default_factory=dict)  # the user's own Spark conf
    gpus_per_executor: int | None = None
    gpu_discovery_script: str | None = None


@dataclass(frozen=True)
class KeyDelivery:
    """How the key and the driver's environment reach the driver: Spark properties, ``--files``
    entries, spark-submit's environment, and what spark-submit runs."""

    conf: dict[str, str] = field(default_factory=dict)
    files: list[str] = field(default_factory=list)
    submit_env: dict[str, str] = field(default_factory=dict)
    environment_travels: bool = False  # spark-submit's environment goes to the driver on the cluster
    application: str = field(default_factory=lambda: os.path.abspath(spark_app.__file__))
    java_class: str | None = None
    leading_args: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Submission:
    """A running (or finished) application this task follows: one it submitted or an earlier try's."""

    try_number: int  # whose files it reads and writes
    driver_id: str | None = None  # a driver on the cluster: its submission id
    log_dir: str | None = None  # where that driver ships its output
    first_chunk: int = 0  # the first chunk of its shipped output to bring into this try's log


class Placement:
    """One way the application runs. ``deploy_mode``: spark-submit's; ``driver_in_task``: the Spark
    driver is spark-submit's child in this task (it ends with the task, nothing to follow)."""

    deploy_mode: ClassVar[str] = "client"
    driver_in_task: ClassVar[bool] = True
    defers: ClassVar[bool] = False  # the task can hand the following to the triggerer
    # Spark's name of the GPU vendor for the resource manager (Kubernetes asks for the device plugin's).
    gpu_vendor: ClassVar[str | None] = None

    def __init__(self, hook: HorovodSparkSubmitHook, settings: ConnectionSettings) -> None:
        self.hook = hook
        self.settings = settings

    @property
    def master(self) -> str:
        return self.hook.master

    def describe(self) -> str:
        return f"Spark master {self.master}, deploy mode {self.deploy_mode}"

    # ---- before anything is written ----

    def check(self, files: TryFiles, deferrable: bool) -> None:
        """A ValueError saying what to change, before anything is written or submitted."""
        if deferrable and not self.defers:
            log.info("deferrable: on %s spark-submit stays with the application until it ends, so the task stays "
                     "too; deploy_mode='cluster' on a standalone master defers", self.describe())

    def reattach(self, files: TryFiles) -> Submission | None:
        """An earlier try's application that this try follows instead of submitting (None: submit)."""
        return None

    # ---- planning and submitting ----

    def driver_env(self, app: Application) -> dict[str, str]:
        return {spark_app.RANK_ENV_ENV: json.dumps(app.rank_env), "PYTHONUNBUFFERED": "1"}

    def deliver_key(self, key: bytes, key_path: str, driver_env: dict[str, str]) -> KeyDelivery:
        raise NotImplementedError

    def application_args(self, app: Application) -> list[str]:
        return list(app.args)

    def spark_conf(self, app: Application, delivery: KeyDelivery) -> dict[str, str]:
        gpus = spark_conf.gpu_conf(app.gpus_per_executor, app.gpu_discovery_script, self.gpu_vendor)
        conf = spark_conf.quick_start_conf({**gpus, **app.conf, **delivery.conf})
        conf.setdefault("spark.log.level", "WARN")  # a training log, not Spark's: runner/spark_log4j2.properties
        return conf

    def submit_env(self, key: bytes, delivery: KeyDelivery) -> dict[str, str]:
        return signing_key.environment_without(key, delivery.submit_env, delivery.environment_travels)

    def submit(self, app: Application, key: bytes) -> Submission:
        """spark-submit the application; in client mode it has trained when this returns."""
        with signing_key.key_file(key) as key_path:
            delivery = self.deliver_key(key, key_path, self.driver_env(app))
            launch = SparkLaunch(application=delivery.application, java_class=delivery.java_class,
                                 application_args=[*delivery.leading_args, *self.application_args(app)],
                                 conf=self.spark_conf(app, delivery), env=self.submit_env(key, delivery),
                                 files=delivery.files, name=app.name)
            self.hook.submit(launch)
        return self.submitted(app)

    def submitted(self, app: Application) -> Submission:
        return Submission(try_number=app.files.try_number)

    # ---- until it ends ----

    def follow(self, submission: Submission) -> None:
        """Until the application ends; an AirflowException when it did not finish. Client mode: it
        already has (spark-submit returned)."""

    def trigger(self, submission: Submission) -> BaseTrigger | None:
        """The trigger that follows it while the task is deferred; None: this placement cannot defer."""
        return None

    def kill(self) -> None:
        """Stop the application; its driver's death stops every rank (runner/spark_app.py)."""
        self.hook.on_kill()

    def close(self) -> None:
        """Nothing of the submission outlives the task (or its deferral)."""
        self.hook.wait_submission_client()


class ClusterPlacement(Placement):
    """The driver runs on a cluster host, which cannot read this Airflow worker's disk."""

    deploy_mode = "cluster"
    driver_in_task = False

    def check(self, files: TryFiles, deferrable: bool) -> None:
        url = str(files.prefix)
        if url.startswith(("file://", "/", "local://")):
            raise ValueError(f"storage path {url} is a local path, and in deploy_mode 'cluster' the Spark driver "
                             "runs on a cluster host that cannot read this Airflow worker's disk: use object "
                             "storage every host reaches (s3://, gs://, abfs://; the horovod connection's "
                             "storage_path) or deploy_mode 'client'")
        super().check(files, deferrable)

    def submit_env(self, key: bytes, delivery: KeyDelivery) -> dict[str, str]:
        # spark-submit's JVM is not the driver here: its own options.
        return spark_conf.quick_start_submit_env(super().submit_env(key, delivery))
