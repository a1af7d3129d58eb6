"""Standalone cluster mode: the driver runs on a Spark worker, followed through the master's REST server.

spark-submit refuses Python applications here, so it submits Spark's own
``org.apache.spark.deploy.PythonRunner`` (what it runs for a ``.py`` in client mode) with spark_app.py
as its first argument; the primary resource is a jar every Spark host has (spark-core's), which the
driver then leaves out of ``spark.jars``. Spark's standalone client hands spark-submit's whole
environment to the driver over Spark RPC, so the key travels as ``HVD_SIGNING_KEY`` there: it reaches
the driver's two processes (the worker's DriverWrapper JVM and its Python child, which drops it before
user code runs) and nothing else. The legacy RPC client is forced (``spark.master.rest.enabled=false``
for the submission): the REST client sends SPARK_* variables only, in the clear.

The driver's output comes through storage (``<try prefix>/driver-log/``), its state from the master;
a later try re-attaches to a driver still running (earlier_driver.py), and the task can defer.
"""

from __future__ import annotations

import logging
import os
import time
from typing import ClassVar

from airflow_provider_hvd.hooks.standalone_driver import DriverOutput, MasterRest, StandaloneDriverHook
from airflow_provider_hvd.placements import spark_conf
from airflow_provider_hvd.placements.base import Application, ClusterPlacement, KeyDelivery, Submission
from airflow_provider_hvd.placements.earlier_driver import DriverRecord, DriverStillRunning, decide
from airflow_provider_hvd.placements.try_files import TryFiles, plain_url
from airflow_provider_hvd.runner import spark_app
from airflow_provider_hvd.triggers.horovod_driver import DriverEnded, HorovodDriverTrigger
from airflow_provider_hvd.version_compat import AirflowException

log = logging.getLogger(__name__)

PYTHON_RUNNER = "org.apache.spark.deploy.PythonRunner"
# How many of an attached driver's last output chunks (about 2 s each) a retry's log repeats.
REPLAYED_CHUNKS = 5


class StandaloneCluster(ClusterPlacement):
    defers: ClassVar[bool] = True

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._attached: StandaloneDriverHook | None = None  # an earlier try's driver, followed

    def check(self, files: TryFiles, deferrable: bool) -> None:
        if "," in self.master:
            raise ValueError(f"deploy_mode 'cluster' on a standalone master with standby masters ({self.master}): "
                             "the operator follows the driver through one master's REST server. Name the active "
                             "master, or use deploy_mode 'client'.")
        super().check(files, deferrable)
        MasterRest(self.hook.rest_endpoint).check()
        if deferrable and not self.settings.has_key:
            raise ValueError("deferrable=True needs the horovod connection's signing key: the task resumes in a new "
                             "process, where a key made for this run alone is gone and rank 0's result could not be "
                             "verified. Set one (its password: python -c 'import secrets; print(secrets.token_hex"
                             "(32))') or pass deferrable=False.")

    # ---- a retry follows its earlier try's driver, if it still runs ----

    def reattach(self, files: TryFiles) -> Submission | None:
        for earlier in files.earlier():
            record = self._record_of(earlier)
            if record is None:
                continue
            try:
                state = MasterRest(self.hook.rest_endpoint).driver_state(record.driver_id)
            except (OSError, ValueError) as exc:
                raise AirflowException(
                    f"cannot tell whether Spark driver {record.driver_id} of try {earlier.try_number} still runs: "
                    f"the master's REST server at {self.hook.rest_endpoint} did not answer ({exc}); this try "
                    f"starts nothing rather than risk a second training") from None
            return self._attach_or_not(record, state)
        return None

    def _record_of(self, files: TryFiles) -> DriverRecord | None:
        try:
            return DriverRecord.from_json(files.driver_record.read_text())
        except FileNotFoundError:
            return None
        except (ValueError, KeyError, TypeError) as exc:
            log.warning("Ignoring try %d's unreadable driver record: %s", files.try_number, exc)
            return None

    def _attach_or_not(self, record: DriverRecord, state: str) -> Submission | None:
        output = DriverOutput(record.log_dir)
        try:
            decision = decide(record, state, output.heartbeat())
        except DriverStillRunning as exc:
            raise AirflowException(str(exc)) from None
        log.info("%s", decision.message)
        if not decision.attach:
            return None
        driver = StandaloneDriverHook(self.hook.rest_endpoint, record.driver_id, record.log_dir)
        if not self.settings.has_key:
            log.warning("... but the horovod connection has no signing key, so the result of a driver that try %d "
                        "started (with a key made for that try alone) could not be verified here. Killing it and "
                        "starting a new one; set a signing key (the connection's password) so that retries attach "
                        "instead.", record.try_number)
            driver.kill()
            return None
        self._attached = driver
        return Submission(try_number=record.try_number, driver_id=record.driver_id, log_dir=record.log_dir,
                          first_chunk=self._replay_from(record, output))

    def _replay_from(self, record: DriverRecord, output: DriverOutput) -> int:
        """The last few chunks of an attached driver's output come into this try's log (the earlier
        try's log has the rest), so that a multi-hour run's log is not copied whole."""
        beat = output.heartbeat()
        first = max(0, (beat.chunks if beat else 0) - REPLAYED_CHUNKS)
        if first:
            log.info("Output of driver %s before chunk %d is in try %d's log (and under %s)", record.driver_id,
                     first, record.try_number, record.log_dir)
        return first

    # ---- submitting ----

    def deliver_key(self, key: bytes, key_path: str, driver_env: dict[str, str]) -> KeyDelivery:
        jar = self.settings.cluster_spark_jar or spark_conf.spark_core_jar()
        application = jar if "://" in jar or jar.startswith("file:") else f"file:{jar}"
        return KeyDelivery(
            # The driver leaves the carrier jar out of what its executors fetch (spark_app.CARRIER_JAR_ENV).
            submit_env={**driver_env, spark_app.SIGNING_KEY_ENV: key.hex(), spark_app.CARRIER_JAR_ENV: application},
            environment_travels=True,
            conf={"spark.master.rest.enabled": "false"},  # the RPC client: it forwards the environment
            application=application, java_class=PYTHON_RUNNER,
            leading_args=[self.settings.cluster_spark_app or os.path.abspath(spark_app.__file__), ""])

    def application_args(self, app: Application) -> list[str]:
        # The driver's stdout stays on a worker: it ships its output to storage.
        return [*super().application_args(app), "--log-dir", plain_url(app.files.driver_log)]

    def submitted(self, app: Application) -> Submission:
        driver_id = self.hook.driver_id
        assert driver_id, "spark-submit said no driver id (the hook raises first)"
        record = DriverRecord(driver_id=driver_id, rest_endpoint=self.hook.rest_endpoint,
                              try_number=app.files.try_number, log_dir=plain_url(app.files.driver_log),
                              submitted_at=time.time())
        app.files.driver_record.write_text(record.to_json())
        return Submission(try_number=app.files.try_number, driver_id=driver_id, log_dir=record.log_dir)

    # ---- following ----

    def _driver(self, submission: Submission) -> StandaloneDriverHook:
        return self._attached or StandaloneDriverHook(self.hook.rest_endpoint, str(submission.driver_id),
                                                      str(submission.log_dir), submission.first_chunk)

    def follow(self, submission: Submission) -> None:
        driver = self._driver(submission)
        driver.output.next_seq = submission.first_chunk
        self.log_following(submission)
        self.check_ended(DriverEnded(str(submission.driver_id), driver.follow(self.hook.process_driver_output),
                                     driver.next_seq))

    def log_following(self, submission: Submission) -> None:
        log.info("Following Spark driver %s through %s; its output comes from %s", submission.driver_id,
                 self.hook.rest_endpoint, submission.log_dir)

    @staticmethod
    def check_ended(ended: DriverEnded) -> None:
        """A driver that did not finish fails the task (the operator puts the runner's own message first)."""
        if ended.state != "FINISHED":
            raise AirflowException(f"Spark driver {ended.driver_id} ended {ended.state} without a result (its own "
                                   f"log is in the work directory of the worker that ran it)")

    def trigger(self, submission: Submission) -> HorovodDriverTrigger:
        log.info("Spark driver %s placed on the cluster: handing this task to the triggerer until it ends",
                 submission.driver_id)
        return HorovodDriverTrigger(rest_endpoint=self.hook.rest_endpoint, driver_id=str(submission.driver_id),
                                    log_dir=str(submission.log_dir), next_seq=submission.first_chunk)

    def kill(self) -> None:
        if self._attached is not None:
            self._attached.kill()
        super().kill()
