"""HorovodSparkSubmitHook: the apache-spark provider's SparkSubmitHook, never guessing where to train."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook

from airflow_provider_hvd.hooks.standalone_driver import MasterRest
from airflow_provider_hvd.runner.spark_app import APPLICATION_MARKER
from airflow_provider_hvd.version_compat import AirflowException, AirflowNotFoundException

LOCAL_MASTER = "local[*]"
# What spark-submit's standalone client says once the master has accepted a cluster-mode driver.
SUBMITTED_LINE = "Driver successfully submitted as"


@dataclass(frozen=True)
class SparkLaunch:
    """What one spark-submit is handed, as a placement plans it."""

    application: str
    application_args: list[str]
    conf: dict[str, str]
    env: dict[str, str]  # spark-submit's whole environment
    name: str
    java_class: str | None = None
    files: list[str] = field(default_factory=list)


class _Silent:
    """A logger that says nothing."""

    def __getattr__(self, name: str) -> Callable[..., None]:
        return lambda *args, **kwargs: None


class HorovodSparkSubmitHook(SparkSubmitHook):
    """SparkSubmitHook that never guesses where to train, made once per task.

    The apache-spark provider silently submits to YARN when the Spark connection does not exist,
    and a fallback to ``local[*]`` would silently train on the Airflow worker: a mistyped
    ``conn_id`` fails, naming it. ``local[*]`` only when asked for: ``conn_id=None``, or a
    connection whose host is ``local[...]``. The master used is ``master``.

    Our application's announcement line (id, Spark UI) goes to ``on_application``, not the log.
    In standalone cluster mode ``submit`` returns once the master has accepted the driver.

    Private API, this class only (tests/test_private_apis.py fails, naming them, if a provider
    release changes them): ``_resolve_connection()`` into ``_connection`` (the one place to check the
    connection and set the master); ``_process_spark_submit_log(itr)`` (where spark-submit's output is
    read as it comes); the command's fields ``_conf``, ``_files``, ``_java_class``, ``_name`` and
    ``_application_args``, set by ``submit`` from its SparkLaunch, so that one hook resolves the
    connection, submits, and kills; standalone cluster mode's ``_should_track_driver_status``,
    ``_driver_id`` and ``_connection["rest_endpoint"]``; ``_submit_sp``, spark-submit's process.
    """

    # What ``conn_id=None`` resolves: a name no deployment uses, so the provider's own lookup
    # takes its "no such connection" path and we put local[*] in place of its YARN.
    _LOCAL = "__airflow_provider_hvd_local_master__"

    def __init__(self, *args: Any, conn_id: str | None = "spark_default",
                 on_application: Callable[[dict[str, Any]], None] | None = None, **kwargs: Any) -> None:
        self._local_asked = conn_id is None
        super().__init__(*args, conn_id=self._LOCAL if conn_id is None else conn_id, **kwargs)
        self._on_application = on_application
        # Standalone cluster mode: set once the master has accepted the driver (_end_submission_client);
        # the submission's thread and outcome while spark-submit's client exits (submit).
        self._accepted = threading.Event()
        self._submission: tuple[threading.Thread, dict[str, Any]] | None = None
        self._ended_submission_client = False

    @property
    def master(self) -> str:
        return self._connection["master"]

    @property
    def deploy_mode(self) -> str:
        """The operator's ``deploy_mode``, else the connection's ``deploy-mode`` extra, else client."""
        return self._connection["deploy_mode"]

    @property
    def driver_id(self) -> str | None:
        """The driver's submission id on a standalone master (cluster mode), once spark-submit said it."""
        return self._driver_id

    @property
    def rest_endpoint(self) -> str:
        """The standalone master's REST server, as the provider builds it (the connection's
        ``rest-scheme`` and ``rest-port`` extras, http and 6066 by default)."""
        endpoint = self._connection.get("rest_endpoint")
        if not endpoint:
            raise ValueError(f"no REST endpoint for master {self.master!r}: standalone cluster mode only")
        return endpoint

    def _resolve_connection(self) -> dict[str, Any]:
        if self._local_asked:
            # The provider would log "defaulting to yarn" for our placeholder name: not a word of it.
            self._log = _Silent()
            try:
                conn_data = super()._resolve_connection()
            finally:
                self._log = None  # LoggingMixin makes the real logger again on next use
            conn_data["master"], conn_data["deploy_mode"] = LOCAL_MASTER, self._deploy_mode or "client"
            return conn_data
        try:
            self.get_connection(self._conn_id)
        except AirflowNotFoundException:
            raise AirflowNotFoundException(
                f"Spark connection {self._conn_id!r} does not exist, so there is no cluster to train on. Create "
                f"it (host spark://<master>:7077, yarn or k8s://https://<api-server>), or, to train on this "
                f"Airflow worker, one whose host is local[*] (e.g. AIRFLOW_CONN_{self._conn_id.upper()}="
                f"'{{\"conn_type\": \"spark\", \"host\": \"local[*]\"}}'), or pass spark_conn_id=None."
            ) from None
        conn_data = super()._resolve_connection()
        # Said on spark-submit's command line whatever the master: a cluster's spark-defaults.conf must not
        # move the driver somewhere this task does not follow.
        conn_data["deploy_mode"] = conn_data["deploy_mode"] or "client"
        return conn_data

    def process_driver_output(self, lines: list[str]) -> None:
        """Lines of the application's output that came another way (a driver on the cluster), read as
        spark-submit's own would be."""
        self._process_spark_submit_log(iter(lines))

    def _process_spark_submit_log(self, itr: Iterator[Any]) -> None:
        """The provider's log handling, minus our application's announcement line (runner/spark_app.py),
        which goes to ``on_application`` as a dict (``application_id``, ``spark_ui``)."""
        super()._process_spark_submit_log(self._announcements(itr))

    def _announcements(self, itr: Iterator[Any]) -> Iterator[Any]:
        for line in itr:
            text = str(line).strip()
            if text.startswith(APPLICATION_MARKER):
                try:
                    info = json.loads(text[len(APPLICATION_MARKER):])
                except ValueError:
                    info = None
                if isinstance(info, dict) and self._on_application is not None:
                    self._on_application(info)
                    continue
            yield line
            # Back here, the provider has read the line (and the driver's id from it).
            if self._should_track_driver_status and self._driver_id and SUBMITTED_LINE in text:
                self._end_submission_client()

    def _end_submission_client(self) -> None:
        """Standalone cluster mode: the master has accepted the driver, and spark-submit's client has
        nothing left to do but sleep 5 s (hard-coded in Spark's ClientEndpoint) before one status poll
        that the follower makes anyway. End it now: the driver belongs to the master, not to it."""
        proc = getattr(self, "_submit_sp", None)
        if proc is not None and proc.poll() is None:
            self._ended_submission_client = True
            proc.terminate()
            self._accepted.set()  # submit() returns; the client's exit is waited for in the background

    def submit(self, application: str | SparkLaunch = "", **kwargs: Any) -> str | None:
        """spark-submit ``application`` (a SparkLaunch: its command's fields too). In standalone cluster
        mode it returns once the master has accepted the driver, while the client's JVM, ended then,
        exits in a thread of its own: ``wait_submission_client`` joins it."""
        if isinstance(application, SparkLaunch):
            kwargs.setdefault("env", application.env)
            application = self.use(application)
        self._ended_submission_client = False
        if not self._should_track_driver_status:
            return self._submit_and_wait(application, **kwargs)
        return self._submit_in_background(application, **kwargs)

    def use(self, launch: SparkLaunch) -> str:
        """Set spark-submit's command from ``launch`` (the provider's fields, which its __init__ set); the
        application to submit."""
        self._conf, self._files, self._java_class = dict(launch.conf), ",".join(launch.files) or None, \
            launch.java_class
        self._name, self._application_args = launch.name, list(launch.application_args)
        return launch.application

    def _submit_in_background(self, application: str, **kwargs: Any) -> str | None:
        self._accepted.clear()
        outcome: dict[str, Any] = {}

        def submit_and_report() -> None:
            try:
                outcome["driver_id"] = self._submit_and_wait(application, **kwargs)
            except BaseException as exc:  # handed to the caller: now, or by wait_submission_client
                outcome["error"] = exc
            finally:
                self._accepted.set()

        self._submission = (threading.Thread(target=submit_and_report, name="hvd-spark-submit", daemon=True),
                            outcome)
        self._submission[0].start()
        self._accepted.wait()
        if outcome:  # the submission is over already (it failed, or its client had ended by itself): say so now
            self.wait_submission_client()
        return self._driver_id

    def wait_submission_client(self, timeout: float = 30.0) -> None:
        """Standalone cluster mode: wait until spark-submit's client, ended once the driver was accepted,
        has exited (killed after ``timeout`` seconds); raise what its submission raised. Idempotent; a
        no-op in other modes."""
        if self._submission is None:
            return
        thread, outcome = self._submission
        thread.join(timeout)
        if thread.is_alive():
            proc = getattr(self, "_submit_sp", None)
            self.log.warning("spark-submit's client (pid %s) had not exited %.0f s after the master accepted the "
                             "driver: killing it", getattr(proc, "pid", None), timeout)
            if proc is not None:
                proc.kill()
            thread.join()
        self._submission = None
        if "error" in outcome:
            raise outcome["error"]

    def _submit_and_wait(self, application: str, **kwargs: Any) -> str | None:
        try:
            return super().submit(application, **kwargs)
        except AirflowException:
            # Our own SIGTERM's exit code, after the master accepted the driver: a submission, not a failure.
            if self._ended_submission_client and self._driver_id:
                return self._driver_id
            raise

    def on_kill(self) -> None:
        """The provider's, except that a standalone cluster-mode driver is killed through the master's
        REST server from Python (the provider runs /usr/bin/curl, absent from slim images)."""
        if not (self._should_track_driver_status and self._driver_id):
            super().on_kill()
            return
        driver_id, self._driver_id = self._driver_id, None
        try:
            self.log.info("Asked the Spark master to kill driver %s: %s", driver_id,
                          MasterRest(self.rest_endpoint).kill_driver(driver_id))
        except (OSError, ValueError) as exc:
            self.log.warning("Could not ask %s to kill driver %s: %s", self.rest_endpoint, driver_id, exc)
        try:
            super().on_kill()  # spark-submit itself, if it still runs
        finally:
            self._driver_id = driver_id
