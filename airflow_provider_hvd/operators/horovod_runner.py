"""HorovodRunnerOperator: one Airflow task = one Horovod training run on Spark."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from functools import cached_property
from typing import Any

from airflow.sdk import BaseOperator, Context, ObjectStoragePath

from airflow_provider_hvd.hooks.horovod import HorovodHook, HorovodSparkSubmitHook
from airflow_provider_hvd.links.horovod import CheckpointsLink, HorovodTimelineLink, SparkUILink
from airflow_provider_hvd.runner import defaults, results, spark_app
from airflow_provider_hvd.runner.checkpoint import (
    CHECKPOINT_DIR_ENV,
    RESUME_FROM_ENV,
    checkpoint_step,
    latest_checkpoint,
)
from airflow_provider_hvd.runner.common.storage import fs_and_path
from airflow_provider_hvd.runner.driver.timeline_publisher import live_view_location
from airflow_provider_hvd.runner.errors import PayloadError
from airflow_provider_hvd.runner.wire import payload
from airflow_provider_hvd.triggers.horovod_driver import HorovodDriverTrigger
from airflow_provider_hvd.runner.driver.log_shipper import LogTail
from airflow_provider_hvd.utils import driver_delivery, jvm_options
from airflow_provider_hvd.utils.driver_record import RECORD_NAME, DriverRecord, DriverStillRunning, decide
from airflow_provider_hvd.version_compat import AirflowException, conf


def _is_template(value: object) -> bool:
    return isinstance(value, str) and "{{" in value


def _trains_here() -> bool:
    """Whether this interpreter can run the ranks itself (the all-in-one environment of a laptop or CI)."""
    return importlib.util.find_spec("horovod") is not None


def _size(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB" if n >= 1 << 20 else f"{n} B"


# How many of an attached driver's last output chunks (about 2 s each) a retry's log repeats.
REPLAYED_CHUNKS = 5


def plain_url(path: ObjectStoragePath) -> str:
    """The URL the Spark application opens with fsspec (it has no Airflow connections)."""
    return f"{path.protocol or 'file'}://{path.path}"


def _filesystem(path: ObjectStoragePath) -> tuple[Any, str]:
    """The filesystem (and its path) to read ``path`` with. A path that names a connection: Airflow's
    filesystem for it. Otherwise the one fsspec keeps for the URL, which this process has already
    connected (ObjectStoragePath writes through it, and the driver's output is followed through it),
    where ObjectStoragePath's ``open`` and ``stat`` would connect a second S3 client of Airflow's own
    (0.2-0.5 s more at the end of each task, measured). Its cached listings of the path's folders are
    dropped: the file may have appeared since one was listed."""
    # ObjectStoragePath has ``conn_id`` in newer Task SDKs (1.3); the oldest supported (1.0) keeps it in
    # storage_options (there a path's own writes go through Airflow's filesystem: the read connects a second
    # client, as before).
    conn_id = getattr(path, "conn_id", None) or path.storage_options.get("conn_id")
    fs, location = (path.fs, path.path) if conn_id else fs_and_path(plain_url(path))
    fs.invalidate_cache(location)
    return fs, location


class HorovodRunnerOperator(BaseOperator):
    """Run ``python_callable(**op_kwargs)`` as ``np`` Horovod ranks in a Spark application.

    ``execute`` signs the callable and its rendered kwargs, writes them under a
    per-try prefix ``<storage_path>/<dag_id>/<run_id>/<task_id>/try-<n>/`` (reference
    pushed to XCom as ``payload``), submits the provider's Spark application through
    the apache-spark provider's ``SparkSubmitHook``, streams every rank's log lines
    into the task log, verifies rank 0's signed result and returns it (the value when
    it is JSON-serialisable, else its URI).

    :param python_callable: the training function; import modules inside it.
    :param np: ranks: ``> 0`` a Spark barrier stage; ``< 0`` subprocesses of the Spark driver
        (templated: ``"{{ params.np }}"`` is checked once rendered).
    :param op_kwargs: keyword arguments for the callable (templated).
    :param spark_conn_id: Spark connection (master, deploy mode): it must exist, and a missing
        one is an error naming it (never a silent fallback). ``None`` trains on Spark ``local[*]``
        on the Airflow worker, as does a connection whose host is ``local[*]``.
    :param deploy_mode: ``client`` (the Spark driver runs on the Airflow worker) or ``cluster``
        (on the cluster: a standalone master's worker, YARN, Kubernetes); default: the Spark
        connection's ``deploy-mode`` extra, else ``client``. The signing key reaches the driver in
        either without a command line or a Spark property (utils/driver_delivery.py). Cluster mode
        needs object storage (a local ``storage_path`` is refused: the driver runs on another host).
        On a standalone master, cluster mode also needs the master's REST server
        (``spark.master.rest.enabled=true``): the task follows the driver by its submission id
        (XCom ``spark_driver_id``), the driver's output comes through storage
        (``<try prefix>/driver-log/``), and killing the task kills the driver and so every rank.
    :param deferrable: where the driver runs on the cluster (standalone cluster mode), hand the
        task to the triggerer once the driver is placed (HorovodDriverTrigger: the driver's state
        and its shipped output into the task log), so no worker slot is held while training runs;
        the task resumes to read rank 0's result. Needs the horovod connection's signing key (a
        key made for one run is gone when the task resumes). In client mode the driver lives in
        this task, which therefore stays. Default: Airflow's ``[operators] default_deferrable``.
    :param gpus_per_executor: GPUs each Spark executor offers; sets Spark's GPU scheduling so that
        each rank (barrier task) holds one GPU (``spark.executor.resource.gpu.amount``,
        ``spark.task.resource.gpu.amount=1``; on Kubernetes also the ``nvidia.com`` vendor). Default:
        whatever the cluster's Spark configuration says.
    :param gpu_discovery_script: the script each executor runs to find its GPUs
        (``spark.executor.resource.gpu.discoveryScript``; ``docker/spark/gpu_discovery.sh`` works
        wherever ``nvidia-smi`` does). ``conf`` overrides any of these.
    :param horovod_conn_id: ``horovod`` connection: signing key, storage, launcher defaults.
    :param storage_path: where payloads, results, timelines and checkpoints go; any
        ObjectStoragePath URL (templated). Defaults to the connection's, then a local folder.
    :param timeline: ``True`` records the Horovod Timeline to ``<try prefix>/timeline.json``;
        a path records it there (templated). The complete file is written there when
        training ends; while it runs, a live view of the most recent events is refreshed
        beside it (``timeline.live.json``). XCom: ``timeline`` (the complete file) and
        ``timeline_live`` (the live view, removed once the complete file is written).
    :param checkpoint_path: checkpoint folder exported to ranks as ``HVD_CHECKPOINT_DIR``
        (``airflow_provider_hvd.checkpoint_dir()``); default ``<try prefix>/checkpoints``
        (templated). Pushed to XCom as ``checkpoint_dir``.
    :param resume_from_checkpoint: ``True``: the newest checkpoint of this task's earlier
        tries (for retries); a folder or checkpoint URL: the newest one there (templated).
        Exported to ranks as ``HVD_RESUME_FROM`` (``airflow_provider_hvd.resume_checkpoint()``).
    :param env: extra environment for every rank (templated).
    :param conf: extra Spark configuration for the application (templated). Spark logs at WARN
        from its first line, so the task log reads as a training log, keeping only the line with
        the Spark UI's address (runner/spark_log4j2.properties); ``{"spark.log.level": "INFO"}``
        brings all of Spark's INFO lines back for debugging. The driver's and executors' JVMs
        start with ``-XX:TieredStopAtLevel=1 -XX:+UseSerialGC`` (quicker to start, and they mostly
        wait: utils/jvm_options.py) unless ``spark.driver.extraJavaOptions`` /
        ``spark.executor.extraJavaOptions`` here choose a collector or tiered compilation.
    :param unpickle_result: ``True``: a result that is not JSON is read, verified and unpickled
        here and returned itself (your XCom backend must be able to store it); default: its URI.

    HorovodRunner's options, each templated; one left unset (None) takes the ``horovod``
    connection's field of the same name, else the default in ``runner/defaults.py``. Where a
    limit can be lifted, pass ``"none"`` (None means "not set here"):

    :param driver_log_verbosity: ``all`` (default) or ``log_callback_only``.
    :param launcher: ``auto`` (default), ``gloo`` or ``mpi``.
    :param mpi_args: extra mpirun arguments: a list, or one string of them.
    :param start_timeout: seconds for every rank to start (default 120).
    :param stall_timeout: seconds a rank may wait in a collective the others never join
        (default 600; ``"none"``: forever).
    :param timeout: seconds for the whole training run (default: ``"none"``).
    :param slot_wait_timeout: seconds to wait for ``np`` free task slots, before the first
        attempt and before each restart (default 30; raise it on an autoscaling cluster).
    :param timeline_interval: seconds between refreshes of the timeline's live view (default 5).
    :param timeline_live_bytes: size of the live view's window of recent events (default
        8 MiB); 0: no live view.
    :param max_restarts: restarts of the rank group inside this task's Spark application after
        a failure a restart can cure (a lost executor or host, a rank killed by a signal, a
        network failure between ranks), each resuming from the newest checkpoint the run wrote
        under ``checkpoint_path``; an exception of the callable is never restarted (default 0).
        Cheaper than an Airflow retry: no new spark-submit, no new application.
    """

    template_fields: Sequence[str] = ("np", "op_kwargs", "storage_path", "timeline", "checkpoint_path",
                                      "resume_from_checkpoint", "env", "conf", *defaults.OPTIONS)
    template_fields_renderers = {"op_kwargs": "py", "env": "json", "conf": "json"}
    ui_color = "#e8f4fd"
    operator_extra_links = (SparkUILink(), HorovodTimelineLink(), CheckpointsLink())

    def __init__(self, *, python_callable: Callable[..., Any], np: int | str, op_kwargs: dict[str, Any] | None = None,
                 spark_conn_id: str | None = "spark_default", deploy_mode: str | None = None,
                 deferrable: bool = conf.getboolean("operators", "default_deferrable", fallback=False),
                 gpus_per_executor: int | None = None, gpu_discovery_script: str | None = None,
                 horovod_conn_id: str = HorovodHook.default_conn_name,
                 storage_path: str | None = None, timeline: bool | str = False,
                 checkpoint_path: str | None = None, resume_from_checkpoint: bool | str = False,
                 env: dict[str, str] | None = None, conf: dict[str, Any] | None = None,
                 driver_log_verbosity: str | None = None, launcher: str | None = None,
                 mpi_args: list[str] | str | None = None, start_timeout: float | str | None = None,
                 stall_timeout: float | str | None = None, timeout: float | str | None = None,
                 slot_wait_timeout: float | str | None = None, timeline_interval: float | str | None = None,
                 timeline_live_bytes: int | str | None = None, max_restarts: int | str | None = None,
                 unpickle_result: bool = False, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if not callable(python_callable):
            raise TypeError(f"python_callable must be a function, got {type(python_callable).__name__}")
        self.python_callable = python_callable
        # A template is checked once rendered (execute); anything else now, before the DAG loads.
        self.np = np if _is_template(np) else defaults.parse_np(np)
        self.op_kwargs = op_kwargs or {}
        self.spark_conn_id = spark_conn_id
        # Checked now, so that a bad value fails when the DAG is parsed.
        driver_delivery.check_deploy_mode(deploy_mode)
        driver_delivery.check_gpus(gpus_per_executor, gpu_discovery_script)
        self.deploy_mode = deploy_mode
        self.deferrable = deferrable
        self.gpus_per_executor = gpus_per_executor
        self.gpu_discovery_script = gpu_discovery_script
        self.horovod_conn_id = horovod_conn_id
        self.storage_path = storage_path
        self.timeline = timeline
        self.checkpoint_path = checkpoint_path
        self.resume_from_checkpoint = resume_from_checkpoint
        self.env = env or {}
        self.conf = conf or {}
        self.unpickle_result = unpickle_result
        given = {"driver_log_verbosity": driver_log_verbosity, "launcher": launcher, "mpi_args": mpi_args,
                 "start_timeout": start_timeout, "stall_timeout": stall_timeout, "timeout": timeout,
                 "slot_wait_timeout": slot_wait_timeout, "timeline_interval": timeline_interval,
                 "timeline_live_bytes": timeline_live_bytes, "max_restarts": max_restarts}
        assert set(given) == set(defaults.OPTIONS), "every runner option is an argument of the operator"
        for name, value in given.items():
            if value is not None and not _is_template(value):
                defaults.parse_option(name, value)  # a bad value fails when the DAG is parsed
            setattr(self, name, value)
        self._submit_hook: HorovodSparkSubmitHook | None = None
        self._attached: tuple[HorovodSparkSubmitHook, str] | None = None  # an earlier try's driver, followed
        self.link_urls: dict[str, str] = {}  # extra link name -> URL, as learnt during execute

    @cached_property
    def hook(self) -> HorovodHook:
        return HorovodHook(horovod_conn_id=self.horovod_conn_id)

    def try_prefix(self, context: Context, try_number: int | None = None) -> ObjectStoragePath:
        ti = context["ti"]
        base = self.hook.storage_path(self.storage_path)
        return base / ti.dag_id / context["run_id"] / ti.task_id / f"try-{try_number or ti.try_number}"

    def execute(self, context: Context) -> Any:
        ti = context["ti"]
        # Where and how it will train, first: a Spark connection that does not exist, or a deploy mode
        # the key cannot reach, fails before anything is written.
        where = HorovodSparkSubmitHook(conn_id=self.spark_conn_id, deploy_mode=self.deploy_mode,
                                       on_application=lambda info: self._on_application(ti, info))
        master = where.master
        kubernetes_secret = self.hook.setting("kubernetes_secret", None)
        deploy_mode = driver_delivery.check(master, where.deploy_mode, connection_key=self.hook.has_signing_key(),
                                            kubernetes_secret=kubernetes_secret)
        prefix = self.try_prefix(context)
        driver_delivery.check_storage(str(prefix), deploy_mode)
        standalone_cluster = deploy_mode == "cluster" and driver_delivery.cluster_kind(master) == "standalone"
        if standalone_cluster:
            where.check_rest_server()
        deferring = self.deferrable and standalone_cluster
        if deferring and not self.hook.has_signing_key():
            raise ValueError(f"deferrable=True needs the signing key of connection {self.horovod_conn_id!r}: the task "
                             "resumes in a new process, where a key made for this run alone is gone and rank 0's "
                             "result could not be verified. Set one (its password: python -c 'import secrets; "
                             "print(secrets.token_hex(32))') or pass deferrable=False.")
        if self.deferrable and not standalone_cluster:
            self.log.info("deferrable: the Spark driver runs in this task (deploy mode %s on %s), so the task stays "
                          "until training ends; deploy_mode='cluster' on a standalone master defers", deploy_mode,
                          master)

        # A retry whose earlier try's driver still runs on the cluster follows that one (one training).
        earlier = self._earlier_driver(context, where) if standalone_cluster else None
        if earlier is not None:
            prefix = self.try_prefix(context, earlier.try_number)
        result_path = prefix / "result.hvd"
        driver_log = prefix / "driver-log"
        rank_env, timeline_path = self._publish_locations(ti, prefix)
        key = self.hook.signing_key()
        try:
            if earlier is not None:
                driver_id, first_chunk = earlier.driver_id, self._replay_from(earlier)
                ti.xcom_push(key="spark_driver_id", value=driver_id)
                self._attached = (where, driver_id)
            else:
                self._submit(context, master, deploy_mode, prefix, key, rank_env, timeline_path, kubernetes_secret,
                             log_dir=driver_log if standalone_cluster else None)
                driver_id, first_chunk = self._submit_hook.driver_id if self._submit_hook else None, 0
            if deferring:
                self.log.info("Spark driver %s placed on the cluster: handing this task to the triggerer until it "
                              "ends", driver_id)
                self.defer(trigger=HorovodDriverTrigger(rest_endpoint=where.rest_endpoint, driver_id=driver_id,
                                                        log_dir=plain_url(driver_log), next_seq=first_chunk),
                           method_name="execute_complete",
                           kwargs={"result_try": earlier.try_number if earlier else ti.try_number})
            if standalone_cluster:
                state = where.follow_driver(driver_id, plain_url(driver_log), first_chunk=first_chunk)
                self._check_driver_finished(result_path, driver_id, state)
            return self._read_result(result_path, key)
        finally:
            # Standalone cluster mode: spark-submit's client, ended once the driver was accepted, exits
            # while the task goes on (HorovodSparkSubmitHook.submit); nothing of it outlives the task.
            if self._submit_hook is not None:
                self._submit_hook.wait_submission_client()

    def _publish_locations(self, ti: Any,
                           prefix: ObjectStoragePath) -> tuple[dict[str, str], ObjectStoragePath | None]:
        """XCom (and links) for where this run's checkpoints and timeline go; the ranks' environment."""
        checkpoint_dir = ObjectStoragePath(self.checkpoint_path) if self.checkpoint_path else prefix / "checkpoints"
        ti.xcom_push(key="checkpoint_dir", value=str(checkpoint_dir))
        self._publish_link(ti, CheckpointsLink, str(checkpoint_dir))
        timeline_path = None
        if self.timeline:
            timeline_path = prefix / "timeline.json" if self.timeline is True else ObjectStoragePath(self.timeline)
            ti.xcom_push(key="timeline", value=str(timeline_path))
            self._publish_link(ti, HorovodTimelineLink, str(timeline_path))
            if self.runner_options().get("timeline_live_bytes", defaults.TIMELINE_LIVE_BYTES):
                ti.xcom_push(key="timeline_live", value=live_view_location(str(timeline_path)))
        return {**self.env, CHECKPOINT_DIR_ENV: plain_url(checkpoint_dir)}, timeline_path

    def _submit(self, context: Context, master: str, deploy_mode: str, prefix: ObjectStoragePath, key: bytes,
                rank_env: dict[str, str], timeline_path: ObjectStoragePath | None, kubernetes_secret: str | None,
                log_dir: ObjectStoragePath | None) -> None:
        """Sign and write the payload, then spark-submit the application (which, in client mode, trains
        before it returns); a standalone cluster-mode driver is recorded for later tries."""
        ti = context["ti"]
        sealed = payload.seal(payload.dumps_call(self.python_callable, self.op_kwargs), key, payload.KIND_CALL)
        payload_path = prefix / "payload.hvd"
        payload_path.parent.mkdir(parents=True, exist_ok=True)
        payload_path.write_bytes(sealed)
        ti.xcom_push(key="payload", value={"uri": str(payload_path), "size": len(sealed),
                                           "sha256": hashlib.sha256(sealed).hexdigest()})
        self.log.info("Payload (%d bytes) written to %s", len(sealed), payload_path)

        result_path = prefix / "result.hvd"
        resume = self._resume_from(context)
        if resume:
            rank_env = {**rank_env, RESUME_FROM_ENV: resume}
            self.log.info("Resuming from checkpoint %s (step %d)", resume, checkpoint_step(resume))
        np = self._np()
        args = ["--payload", plain_url(payload_path), "--result", plain_url(result_path), "--np", str(np),
                "--options", json.dumps(self.runner_options())]
        if log_dir is not None:  # the driver's stdout stays on a worker: it ships its output to storage
            args += ["--log-dir", plain_url(log_dir)]
        if timeline_path is not None:
            args += ["--timeline", plain_url(timeline_path)]

        # One environment for Airflow and training, on one machine (a laptop, CI): the driver and
        # its workers use this interpreter and find its tools (mpirun's helpers) first.
        all_in_one = _trains_here() and master.startswith("local")
        driver_env = {spark_app.RANK_ENV_ENV: json.dumps(rank_env), "PYTHONUNBUFFERED": "1"}
        if deploy_mode == "client":  # the driver runs here: it ends with this task (spark_app._end_with_owner)
            driver_env[spark_app.OWNER_PID_ENV] = str(os.getpid())
        if all_in_one:
            driver_env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")
        with driver_delivery.key_file(key) as key_path:
            delivery = driver_delivery.plan(master, deploy_mode, key_path=key_path, driver_env=driver_env,
                                            kubernetes_secret=kubernetes_secret, key=key,
                                            cluster_app=self.hook.setting("cluster_spark_app", None),
                                            cluster_jar=self.hook.setting("cluster_spark_jar", None))
            self._submit_hook = self._make_submit_hook(args, delivery, context, master, deploy_mode, all_in_one)
            self.log.info("Submitting the Horovod application (np=%d) to Spark master %s, deploy mode %s", np,
                          self._submit_hook.master, deploy_mode)
            try:
                submit_env = driver_delivery.submit_environment(key, delivery)
                if deploy_mode == "cluster":  # spark-submit's JVM is not the driver: its own options
                    submit_env = jvm_options.quick_start_submit_env(submit_env)
                self._submit_hook.submit(application=delivery.application, env=submit_env)
            except AirflowException as exc:
                raise AirflowException(self._failure_message(result_path) or str(exc)) from exc
        if log_dir is not None:
            hook = self._submit_hook
            assert hook.driver_id, "spark-submit said no driver id (the hook raises first)"
            ti.xcom_push(key="spark_driver_id", value=hook.driver_id)
            record = DriverRecord(driver_id=hook.driver_id, rest_endpoint=hook.rest_endpoint,
                                  try_number=ti.try_number, log_dir=plain_url(log_dir), submitted_at=time.time())
            (prefix / RECORD_NAME).write_text(record.to_json())

    def _earlier_driver(self, context: Context, where: HorovodSparkSubmitHook) -> DriverRecord | None:
        """The newest earlier try's driver, when this try should follow it rather than start one
        (utils/driver_record.py says when); None: submit a new one."""
        ti = context["ti"]
        for earlier in range(ti.try_number - 1, 0, -1):
            try:
                record = DriverRecord.from_json((self.try_prefix(context, earlier) / RECORD_NAME).read_text())
            except FileNotFoundError:
                continue
            except (ValueError, KeyError, TypeError) as exc:
                self.log.warning("Ignoring try %d's unreadable driver record: %s", earlier, exc)
                continue
            try:
                state = where.driver_state(record.driver_id)
            except (OSError, ValueError) as exc:
                raise AirflowException(
                    f"cannot tell whether Spark driver {record.driver_id} of try {earlier} still runs: the master's "
                    f"REST server at {where.rest_endpoint} did not answer ({exc}); this try starts nothing rather "
                    f"than risk a second training") from None
            try:
                decision = decide(record, state, LogTail(record.log_dir).heartbeat())
            except DriverStillRunning as exc:
                raise AirflowException(str(exc)) from None
            self.log.info("%s", decision.message)
            if decision.attach and not self.hook.has_signing_key():
                self.log.warning(
                    "... but connection %r has no signing key, so the result of a driver that try %d started (with "
                    "a key made for that try alone) could not be verified here. Killing it and starting a new one; "
                    "set a signing key (the connection's password) so that retries attach instead.",
                    self.horovod_conn_id, earlier)
                where.kill_driver(record.driver_id)
                return None
            return record if decision.attach else None
        return None

    def _replay_from(self, record: DriverRecord) -> int:
        """The first chunk of an attached driver's output to bring into this try's log: the last few
        (the earlier try's log has the rest), so that a multi-hour run's log is not copied whole."""
        beat = LogTail(record.log_dir).heartbeat() or {}
        first = max(0, int(beat.get("chunks", 0)) - REPLAYED_CHUNKS)
        if first:
            self.log.info("Output of driver %s before chunk %d is in try %d's log (and under %s)", record.driver_id,
                          first, record.try_number, record.log_dir)
        return first

    def execute_complete(self, context: Context, event: dict[str, Any], result_try: int | None = None) -> Any:
        """Back from the triggerer: the driver has ended; rank 0's result, verified with the connection's key."""
        # Where the driver was told to write: this try's prefix, or the earlier try's it attached to.
        path = self.try_prefix(context, result_try) / "result.hvd"
        self._check_driver_finished(path, event.get("driver_id"), event.get("state"))
        return self._read_result(path, self.hook.signing_key())

    def _check_driver_finished(self, result_path: ObjectStoragePath, driver_id: str | None,
                               state: str | None) -> None:
        """Standalone cluster mode, followed here or by the trigger: a driver that did not finish fails the
        task with the runner's own message when it left one."""
        if state != "FINISHED":
            raise AirflowException(self._failure_message(result_path) or
                                   f"Spark driver {driver_id} ended {state} without a result (its own log is "
                                   f"in the work directory of the worker that ran it)")

    def _publish_link(self, ti: Any, link: type, url: str) -> None:
        """Show the link in the UI now, while training runs (Airflow itself pushes links only at the end)."""
        self.link_urls[link.name] = url
        ti.xcom_push(key=link().xcom_key, value=url)

    def _on_application(self, ti: Any, info: dict[str, Any]) -> None:
        ui = info.get("spark_ui")
        self.log.info("Spark application %s started; its UI: %s", info.get("application_id"),
                      ui or "disabled (spark.ui.enabled=false)")
        if ui:
            self._publish_link(ti, SparkUILink, str(ui))

    def _np(self) -> int:
        try:
            return defaults.parse_np(self.np)
        except (TypeError, ValueError) as exc:
            raise type(exc)(f"np rendered to {self.np!r}: {exc}") from None

    def runner_options(self) -> dict[str, Any]:
        """HorovodRunner's options for this task: the operator's argument, else the connection's
        field, checked; those set in neither are left out and take the runner's default. JSON-ready."""
        options: dict[str, Any] = {}
        for name in defaults.OPTIONS:
            value, source = getattr(self, name), "argument"
            if value is None:
                value, source = self.hook.setting(name, None), f"field of connection {self.horovod_conn_id!r}"
            if value is None:
                continue
            try:
                parsed = defaults.parse_option(name, value)
            except ValueError as exc:
                raise ValueError(f"HorovodRunnerOperator {source} {name}: {exc}") from None
            options[name] = list(parsed) if isinstance(parsed, tuple) else parsed
        return options

    def _make_submit_hook(self, args: list[str], delivery: driver_delivery.DriverDelivery, context: Context,
                          master: str, deploy_mode: str, all_in_one: bool) -> HorovodSparkSubmitHook:
        ti = context["ti"]
        # The whole conf is built before the hook: SparkSubmitHook keeps ``conf or {}``, so an
        # empty dict changed after it was handed over would never reach spark-submit.
        conf = {**driver_delivery.gpu_conf(master, self.gpus_per_executor, self.gpu_discovery_script), **self.conf,
                **delivery.conf}
        # The driver's and executors' JVMs start on every task's critical path and then mostly wait:
        # C1 only and the serial collector, unless the user chose otherwise (utils/jvm_options.py).
        conf = jvm_options.quick_start_conf(conf)
        # Spark's INFO chatter would bury the ranks' lines in the task log. spark.log.level applies
        # only once the SparkContext exists, so the driver's JVM also starts with our log4j2
        # configuration (WARN, plus the line with the Spark UI's address). The one switch back:
        # conf={"spark.log.level": "INFO"} (or DEBUG, ...) leaves Spark's own configuration in place.
        level = str(conf.setdefault("spark.log.level", "WARN")).upper()
        # In cluster mode the driver's JVM log stays on the cluster, whose hosts may not have this path.
        if level in ("WARN", "ERROR", "FATAL", "OFF") and deploy_mode == "client":
            option = f"-Dlog4j2.configurationFile=file:{spark_app.LOG4J2_CONFIG}"
            existing = str(conf.get("spark.driver.extraJavaOptions", ""))
            if "log4j2.configurationFile" not in existing:  # the user's own configuration wins
                conf["spark.driver.extraJavaOptions"] = f"{existing} {option}".strip()
        if all_in_one and not os.environ.get("PYSPARK_PYTHON"):
            # Where the Airflow image has no horovod, Spark's own settings choose instead
            # (spark-defaults.conf, PYSPARK_PYTHON).
            conf.setdefault("spark.pyspark.python", sys.executable)
        # No env_vars: the Spark provider puts them on the command line for YARN and Kubernetes;
        # the driver's environment comes from ``delivery`` (conf, files, spark-submit's env).
        return HorovodSparkSubmitHook(
            conn_id=self.spark_conn_id, deploy_mode=deploy_mode, conf=conf,
            name=f"horovod-{ti.dag_id}-{ti.task_id}", on_application=lambda info: self._on_application(ti, info),
            application_args=[*delivery.leading_args, *args], java_class=delivery.main_class,
            files=",".join(delivery.files) or None)

    def _resume_from(self, context: Context) -> str | None:
        wanted = self.resume_from_checkpoint
        if not wanted:
            return None
        if wanted is True or str(wanted).lower() == "true":
            try_number = context["ti"].try_number
            for earlier in range(try_number - 1, 0, -1):
                found = latest_checkpoint(plain_url(self.try_prefix(context, earlier) / "checkpoints"))
                if found:
                    return found
            if self.checkpoint_path:
                return latest_checkpoint(plain_url(ObjectStoragePath(self.checkpoint_path)))
            self.log.info("No checkpoint from an earlier try: training starts fresh")
            return None
        location = plain_url(ObjectStoragePath(str(wanted)))
        try:
            checkpoint_step(location)
            return location
        except ValueError:
            found = latest_checkpoint(location)
            if not found:
                self.log.info("No checkpoint under %s yet: training starts fresh", location)
            return found

    def _failure_message(self, result_path: ObjectStoragePath) -> str | None:
        error_path = result_path.parent / (result_path.name + ".error.json")
        try:
            report = json.loads(error_path.read_text())
        except (FileNotFoundError, ValueError, OSError):
            return None
        return f"{report['type']}: {report['message']}"

    def _read_result(self, result_path: ObjectStoragePath, key: bytes) -> Any:
        """Rank 0's value when it came back as JSON; else its URI, left unread unless ``unpickle_result``."""
        fs, path = _filesystem(result_path)
        try:
            with fs.open(path, "rb") as f:
                header = f.read(payload.HEADER_SIZE)
            kind = results.result_kind(header, key)
            if kind == payload.KIND_RESULT and not self.unpickle_result:
                size = fs.size(path)
                self.log.info("Rank 0's result is not JSON (a %s pickle): left at %s. Read it downstream with "
                              "airflow_provider_hvd.hooks.horovod.load_result(<this task's return value>)",
                              _size(size), result_path)
                if not self.hook.has_signing_key():
                    self.log.warning("Connection %r has no signing key, so the result was signed with a key made "
                                     "for this run alone: nothing can verify it after this task. Set one (the "
                                     "connection's password: python -c 'import secrets; print(secrets.token_hex"
                                     "(32))') to read non-JSON results downstream.", self.horovod_conn_id)
                return str(result_path)
            value = results.open_result(fs.cat_file(path), key)
        except FileNotFoundError:
            raise AirflowException(f"the Spark application ended without writing rank 0's result to "
                                   f"{result_path}") from None
        except PayloadError as exc:
            raise AirflowException(f"refused rank 0's result at {result_path}: {exc}") from exc
        shown = repr(value)
        self.log.info("Rank 0 returned %s", shown if len(shown) <= 300 else shown[:300] + " ...")
        return value

    def on_kill(self) -> None:
        """Stop the Spark application; its driver's death stops every rank (see runner/spark_app.py)."""
        if self._attached is not None:
            hook, driver_id = self._attached
            hook.kill_driver(driver_id)
        if self._submit_hook is not None:
            self._submit_hook.on_kill()
