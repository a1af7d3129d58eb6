"""HorovodHook: the ``horovod`` connection (storage, signing key, launcher defaults) and Spark submission."""

from __future__ import annotations

import json
import secrets
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook
from airflow.sdk import ObjectStoragePath

from airflow_provider_hvd.get_provider_info import CONN_FIELDS, UI_FIELD_BEHAVIOUR
from airflow_provider_hvd.runner.driver.log_shipper import LogTail
from airflow_provider_hvd.runner.errors import PayloadError
from airflow_provider_hvd.runner.spark_app import APPLICATION_MARKER
from airflow_provider_hvd.utils import standalone_master
from airflow_provider_hvd.version_compat import AirflowException, AirflowNotFoundException, BaseHook, mask_secret

DEFAULT_STORAGE = "file:///tmp/airflow-provider-hvd"
LOCAL_MASTER = "local[*]"
# What spark-submit's standalone client says once the master has accepted a cluster-mode driver.
SUBMITTED_LINE = "Driver successfully submitted as"


class HorovodHook(BaseHook):
    """Settings shared by every Horovod task of a deployment, from a ``horovod`` connection.

    Connection fields: *Host* unused; *Password*: the signing key (hex, 32 bytes or
    more; when empty a fresh key is made for each run); *Extra* (JSON):
    ``storage_path`` (any ObjectStoragePath URL), ``kubernetes_secret`` (``<name>:<key>``, the
    Kubernetes Secret holding the signing key, for cluster mode on Kubernetes), and every
    HorovodRunner option (``launcher``, ``driver_log_verbosity``, ``max_restarts``, ...). A
    missing connection means defaults: per-run keys and the operator's own ``storage_path``.

    :param horovod_conn_id: the connection id (default ``horovod_default``).
    """

    conn_name_attr = "horovod_conn_id"
    default_conn_name = "horovod_default"
    conn_type = "horovod"
    hook_name = "Horovod"

    @classmethod
    def get_ui_field_behaviour(cls) -> dict[str, Any]:
        """For Airflow before 3.2, which asks the hook; later ones read provider info (one definition)."""
        return {key.replace("-", "_"): value for key, value in UI_FIELD_BEHAVIOUR.items()}

    def __init__(self, horovod_conn_id: str = default_conn_name, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.horovod_conn_id = horovod_conn_id
        self._settings: dict[str, Any] | None = None

    def get_conn(self) -> dict[str, Any]:
        """The connection's settings: ``signing_key`` (hex or None) and the extra fields."""
        if self._settings is None:
            try:
                conn = self.get_connection(self.horovod_conn_id)
            except AirflowNotFoundException:
                self._settings = {"signing_key": None}
            else:
                self._settings = {**conn.extra_dejson, "signing_key": conn.password or None}
        return self._settings

    def signing_key(self) -> bytes:
        """The connection's key, or a fresh per-run key. Registered with Airflow's secrets masker, so
        a log line that happens to carry it (a library echoing its environment) shows ``***``."""
        key = self._signing_key()
        mask_secret(key.hex())
        return key

    def _signing_key(self) -> bytes:
        key_hex = self.get_conn().get("signing_key")
        if not key_hex:
            return secrets.token_bytes(32)
        try:
            key = bytes.fromhex(key_hex.strip())
        except ValueError:
            raise ValueError(f"the signing key of connection {self.horovod_conn_id!r} is not hex; generate one "
                             "with: python -c 'import secrets; print(secrets.token_hex(32))'") from None
        if len(key) < 16:
            raise ValueError(f"the signing key of connection {self.horovod_conn_id!r} has {len(key)} bytes; "
                             "use at least 16 (32 recommended)")
        return key

    def has_signing_key(self) -> bool:
        """Whether results can be verified after the run: only with the connection's key."""
        return bool(self.get_conn().get("signing_key"))

    def load_result(self, uri: str) -> Any:
        """Rank 0's value from the result file a HorovodRunnerOperator left at ``uri`` (its return
        value when the value was not JSON), after checking its signature with the connection's key."""
        from airflow_provider_hvd.runner.results import open_result

        if not self.has_signing_key():
            raise ValueError(f"connection {self.horovod_conn_id!r} has no signing key, so no result can be verified "
                             "after its run (each run signed with a key of its own). Set one as the connection's "
                             "password (python -c 'import secrets; print(secrets.token_hex(32))') and run the "
                             "training again.")
        try:
            sealed = ObjectStoragePath(uri).read_bytes()
        except FileNotFoundError:
            raise FileNotFoundError(f"no result at {uri}: pass the training task's return value (its XCom "
                                    "return_value) as it is") from None
        try:
            return open_result(sealed, self.signing_key())
        except PayloadError as exc:
            raise PayloadError(f"refused the result at {uri}: {exc}") from None

    def storage_path(self, override: str | None = None) -> ObjectStoragePath:
        return ObjectStoragePath(override or self.setting("storage_path", None) or DEFAULT_STORAGE)

    def setting(self, name: str, default: Any) -> Any:
        """An extra field of the connection, as the UI form (``extra__horovod__<name>``) or a JSON
        extra (``<name>``) sets it; ``default`` when unset or empty."""
        if name not in CONN_FIELDS:
            raise KeyError(f"{name!r} is not a field of the horovod connection ({', '.join(CONN_FIELDS)}): declare "
                           "it in get_provider_info.CONN_FIELDS so that Airflow's UI shows it")
        settings = self.get_conn()
        value = settings.get(name)
        if value in (None, ""):
            value = settings.get(f"extra__{self.conn_type}__{name}")
        return default if value in (None, "") else value


def load_result(uri: str, horovod_conn_id: str = HorovodHook.default_conn_name) -> Any:
    """Rank 0's value that a HorovodRunnerOperator left in storage (``uri``: that task's return
    value when the value was not JSON), verified with the ``horovod`` connection's signing key::

        @task
        def evaluate(result_uri: str):
            state = load_result(result_uri)

        evaluate(train.output)
    """
    return HorovodHook(horovod_conn_id=horovod_conn_id).load_result(uri)


class _Silent:
    """A logger that says nothing."""

    def __getattr__(self, name: str) -> Callable[..., None]:
        return lambda *args, **kwargs: None


class HorovodSparkSubmitHook(SparkSubmitHook):
    """SparkSubmitHook that never guesses where to train.

    The apache-spark provider silently submits to YARN when the Spark connection does not
    exist, and a fallback to ``local[*]`` would silently train on the Airflow worker: a
    mistyped ``conn_id`` must fail, naming it. ``local[*]`` only when asked for: ``conn_id=None``,
    or a connection whose host is ``local[...]``. The master actually used is in ``master``.

    It also hands the line where our Spark application says its id and UI address to
    ``on_application`` (the operator's links) instead of the log.

    Private API, this class only: the hook resolves its connection once, in ``__init__``,
    through ``_resolve_connection()`` into ``_connection`` (a dict with ``master`` and
    ``deploy_mode``), and has no public way to change or read the master. Overriding that
    method is the one place to check the connection and set the master before the hook builds
    spark-submit's command. ``_process_spark_submit_log(itr)`` is where the hook reads
    spark-submit's output line by line, the one place to see a line as it comes (the driver's
    shipped output goes through it too, in standalone cluster mode). In that mode the provider
    sets ``_should_track_driver_status``, keeps the driver's submission id it read from that
    output in ``_driver_id`` and the master's REST server in ``_connection["rest_endpoint"]``;
    it polls and kills through /usr/bin/curl, which ``follow_driver`` and ``on_kill`` replace; ``submit()``
    keeps spark-submit's process in ``_submit_sp``, ended once the master has accepted the driver.
    tests/test_private_apis.py fails, naming them, if a provider release changes them.

    It also follows a standalone cluster-mode driver (the provider's own status tracking is not
    called by its submit() in 6.3): ``check_rest_server``, ``follow_driver``, ``kill_driver``.
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
        that follow_driver makes anyway. End it now: the driver belongs to the master, not to it."""
        proc = getattr(self, "_submit_sp", None)
        if proc is not None and proc.poll() is None:
            self._ended_submission_client = True
            proc.terminate()
            self._accepted.set()  # submit() returns; the client's exit is waited for in the background

    def submit(self, application: str = "", **kwargs: Any) -> str | None:
        """The provider's submit; in standalone cluster mode it returns once the master has accepted the
        driver, while the client's JVM, ended then, exits (0.3-0.4 s of shutdown hooks on a busy host,
        measured) in a thread of its own: ``wait_submission_client`` joins it (the operator does, before it
        defers or returns)."""
        self._ended_submission_client = False
        if not self._should_track_driver_status:
            return self._submit_and_wait(application, **kwargs)
        self._accepted.clear()
        outcome: dict[str, Any] = {}

        def submit_in_background() -> None:
            try:
                outcome["driver_id"] = self._submit_and_wait(application, **kwargs)
            except BaseException as exc:  # handed to the caller: now, or by wait_submission_client
                outcome["error"] = exc
            finally:
                self._accepted.set()

        self._submission = (threading.Thread(target=submit_in_background, name="hvd-spark-submit", daemon=True),
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

    def _resolve_connection(self) -> dict[str, Any]:
        if self._local_asked:
            # The provider would log "defaulting to yarn" for our placeholder name: not a word of it.
            self._log = _Silent()
            try:
                conn_data = super()._resolve_connection()
            finally:
                self._log = None  # LoggingMixin makes the real logger again on next use
            conn_data["master"], conn_data["deploy_mode"] = LOCAL_MASTER, self._deploy_mode
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
        return super()._resolve_connection()

    @property
    def master(self) -> str:
        return self._connection["master"]

    # ---- standalone cluster mode: the driver runs on a worker; followed through the master's REST server ----

    @property
    def driver_id(self) -> str | None:
        """The driver's submission id on a standalone master (cluster mode), once spark-submit said it."""
        return self._driver_id

    @property
    def rest_endpoint(self) -> str:
        """The standalone master's REST server, as the Spark provider builds it (the connection's
        ``rest-scheme`` and ``rest-port`` extras, http and 6066 by default)."""
        endpoint = self._connection.get("rest_endpoint")
        if not endpoint:
            raise ValueError(f"no REST endpoint for master {self.master!r}: standalone cluster mode only")
        return endpoint

    def check_rest_server(self) -> None:
        """Fail now, saying what to change, when the master's REST server does not answer: without it
        a cluster-mode driver could be started but neither followed nor killed."""
        try:
            standalone_master.driver_state(self.rest_endpoint, "hvd-probe")  # any answer will do
        except (OSError, ValueError) as exc:
            raise ValueError(
                f"the Spark master's REST server at {self.rest_endpoint} does not answer ({exc}). Deploy mode "
                f"'cluster' on a standalone master follows and kills the driver through it: start the master with "
                f"spark.master.rest.enabled=true (SPARK_MASTER_OPTS=-Dspark.master.rest.enabled=true), and set the "
                f"Spark connection's rest-port extra if it is not 6066; or use deploy_mode 'client'.") from None

    def driver_state(self, driver_id: str) -> str:
        return standalone_master.driver_state(self.rest_endpoint, driver_id)

    def kill_driver(self, driver_id: str) -> None:
        try:
            answer = standalone_master.kill_driver(self.rest_endpoint, driver_id)
        except (OSError, ValueError) as exc:
            self.log.warning("Could not ask %s to kill driver %s: %s", self.rest_endpoint, driver_id, exc)
            return
        self.log.info("Asked the Spark master to kill driver %s: %s", driver_id, answer)

    def follow_driver(self, driver_id: str, log_dir: str, first_chunk: int = 0, poll_interval: float = 1.0,
                      unreachable_limit: float = 120.0) -> str:
        """Until the driver ends: its output (shipped to ``log_dir`` by runner/driver/log_shipper.py),
        from chunk ``first_chunk`` on, into this task's log, line by line as the client-mode driver's
        would come; returns its final state. Looks every ``poll_interval`` seconds, quicker in the
        first half-minute (standalone_master.poll_delay). The master unreachable for ``unreachable_limit`` seconds
        in a row is an error naming it."""
        tail = LogTail(log_dir)
        tail.next_seq = first_chunk
        self.log.info("Following Spark driver %s through %s; its output comes from %s", driver_id,
                      self.rest_endpoint, log_dir)
        unreachable_since: float | None = None
        state = last = None
        started = time.monotonic()
        while True:
            try:
                state = self.driver_state(driver_id)
                unreachable_since = None
            except (OSError, ValueError) as exc:
                unreachable_since = unreachable_since or time.monotonic()
                if time.monotonic() - unreachable_since > unreachable_limit:
                    raise OSError(f"the Spark master's REST server at {self.rest_endpoint} has not answered for "
                                  f"{unreachable_limit:.0f} s ({exc}); driver {driver_id} may still be running: "
                                  f"kill it there if it is") from None
            ended = state in standalone_master.DRIVER_ENDED
            lines, finished = tail.look(ended)
            self._process_spark_submit_log(iter(lines))
            if finished and not ended:  # its own word, a poll or two before the master's
                state, ended = "FINISHED", True
            if state != last:
                self.log.info("Spark driver %s: %s", driver_id, state)
                last = state
            if ended:
                return str(state)
            time.sleep(standalone_master.poll_delay(time.monotonic() - started, poll_interval))

    def on_kill(self) -> None:
        """The Spark provider's, except that a standalone cluster-mode driver is killed through the
        master's REST server from Python (the provider runs /usr/bin/curl, absent from slim images)."""
        if self._should_track_driver_status and self._driver_id:
            driver_id, self._driver_id = self._driver_id, None
            self.kill_driver(driver_id)
            try:
                super().on_kill()  # spark-submit itself, if it still runs
            finally:
                self._driver_id = driver_id
            return
        super().on_kill()

    @property
    def deploy_mode(self) -> str | None:
        """The operator's ``deploy_mode``, else the connection's ``deploy-mode`` extra (None: client)."""
        return self._connection["deploy_mode"]
