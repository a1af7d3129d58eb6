"""HorovodRunnerOperator: one Airflow task = one Horovod training run on Spark."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from functools import cached_property
from typing import Any

from airflow.sdk import BaseOperator, Context, ObjectStoragePath

from airflow_provider_hvd.hooks.horovod import HorovodHook
from airflow_provider_hvd.hooks.spark_submit import HorovodSparkSubmitHook
from airflow_provider_hvd.links.horovod import CheckpointsLink, HorovodTimelineLink, SparkUILink, publish_link
from airflow_provider_hvd.operators.run_outcome import read_result, resume_checkpoint, runner_message_first
from airflow_provider_hvd.placements import ConnectionSettings, Placement, check_deploy_mode, choose
from airflow_provider_hvd.placements.base import Application, Submission
from airflow_provider_hvd.placements.spark_conf import check_gpus
from airflow_provider_hvd.placements.standalone import StandaloneCluster
from airflow_provider_hvd.placements.try_files import TryFiles, plain_url
from airflow_provider_hvd.runner import defaults
from airflow_provider_hvd.runner.checkpoint import CHECKPOINT_DIR_ENV, RESUME_FROM_ENV, checkpoint_step
from airflow_provider_hvd.runner.driver.timeline_publisher import live_view_location
from airflow_provider_hvd.runner.wire import payload
from airflow_provider_hvd.triggers.horovod_driver import DriverEnded
from airflow_provider_hvd.version_compat import conf


def _is_template(value: object) -> bool:
    return isinstance(value, str) and "{{" in value


class HorovodRunnerOperator(BaseOperator):
    __doc__ = """Run ``python_callable(**op_kwargs)`` as ``np`` Horovod ranks in a Spark application.

    ``execute`` chooses the placement, signs the callable and its rendered kwargs into the try's
    storage ``<storage_path>/<dag_id>/<run_id>/<task_id>/try-<n>/`` (XCom ``payload``), submits the
    Spark application, follows it (every rank's lines into the task log) or defers, and returns
    rank 0's verified result (the value when it is JSON, else its URI).

    :param python_callable: the training function; import modules inside it.
    :param np: ranks: ``> 0`` a Spark barrier stage; ``< 0`` subprocesses of the Spark driver
        (templated: ``"{{ params.np }}"`` is checked once rendered).
    :param op_kwargs: keyword arguments for the callable (templated).
    :param spark_conn_id: Spark connection (master, deploy mode): it must exist, and a missing
        one is an error naming it (never a silent fallback). ``None`` trains on Spark ``local[*]``
        on the Airflow worker, as does a connection whose host is ``local[*]``.
    :param deploy_mode: ``client`` (the Spark driver runs in this task) or ``cluster`` (on the
        cluster: a standalone master's worker, YARN, Kubernetes); default: the Spark connection's
        ``deploy-mode`` extra, else ``client``. The pair of master and deploy mode picks the
        placement (``placements/``); cluster mode needs object storage, and on a standalone master
        the master's REST server (docs/deploy.md).
    :param deferrable: hand the task to the triggerer once the driver is placed, where it runs on
        the cluster (standalone cluster mode), so no worker slot is held while training runs. Needs
        the horovod connection's signing key. Default: Airflow's ``[operators] default_deferrable``.
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
    :param conf: extra Spark configuration for the application (templated). Spark logs at WARN, so
        the task log reads as a training log; ``{"spark.log.level": "INFO"}`` brings Spark's INFO
        lines back. The application's JVMs start quick (placements/spark_conf.py) unless these
        choose their own collector or tiered compilation.
    :param unpickle_result: ``True``: a result that is not JSON is read, verified and unpickled
        here and returned itself (your XCom backend must be able to store it); default: its URI.

    HorovodRunner's options, each templated; one left unset (None) takes the ``horovod`` connection's
    field of the same name, else its default (runner/defaults.py). ``"none"`` lifts a limit:

{options}
    """.replace("{options}", defaults.param_doc())

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
        check_deploy_mode(deploy_mode)
        check_gpus(gpus_per_executor, gpu_discovery_script)
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
        given = locals()
        for name in defaults.OPTIONS:  # every one is an argument above (tests/test_options.py)
            if given[name] is not None and not _is_template(given[name]):
                defaults.parse_option(name, given[name])  # a bad value fails when the DAG is parsed
            setattr(self, name, given[name])
        self._placement: Placement | None = None
        self.link_urls: dict[str, str] = {}  # extra link name -> URL, as learnt during execute

    @cached_property
    def hook(self) -> HorovodHook:
        return HorovodHook(horovod_conn_id=self.horovod_conn_id)

    def try_files(self, context: Context, try_number: int | None = None) -> TryFiles:
        ti = context["ti"]
        task_prefix = self.hook.storage_path(self.storage_path) / ti.dag_id / context["run_id"] / ti.task_id
        return TryFiles(task_prefix, try_number or ti.try_number)

    def execute(self, context: Context) -> Any:
        ti = context["ti"]
        # Where and how it will train, first: a Spark connection that does not exist, or a placement
        # the key cannot reach, fails before anything is written.
        placement = self._placement = self._choose_placement(ti)
        files = self.try_files(context)
        placement.check(files, self.deferrable)
        self._np(), self.runner_options()  # the rendered arguments, checked before anything is written
        key = self.hook.signing_key()
        try:
            # A retry whose earlier try's driver still runs on the cluster follows that one (one training).
            submission = placement.reattach(files)
            run = files.of_try(submission.try_number) if submission else files  # the try it trains in
            rank_env, timeline = self._publish_locations(ti, run)
            if submission is None:
                self._seal_payload(ti, files, key)
                submission = self._submit(placement, self._application(ti, files, rank_env, timeline), key)
            if submission.driver_id:
                ti.xcom_push(key="spark_driver_id", value=submission.driver_id)
            if self.deferrable and placement.defers:
                self.defer(trigger=placement.trigger(submission), method_name="execute_complete",
                           kwargs={"result_try": submission.try_number})
            with runner_message_first(run):
                placement.follow(submission)
            return self._read_result(run.result, key)
        finally:
            placement.close()  # nothing of spark-submit outlives the task or its deferral

    def execute_complete(self, context: Context, event: dict[str, Any], result_try: int | None = None) -> Any:
        """Back from the triggerer: the driver has ended; rank 0's result, verified with the connection's key."""
        files = self.try_files(context, result_try)  # the try whose driver it followed
        with runner_message_first(files):
            StandaloneCluster.check_ended(DriverEnded.from_event(event))
        return self._read_result(files.result, self.hook.signing_key())

    def on_kill(self) -> None:
        """Stop the Spark application; its driver's death stops every rank (see runner/spark_app.py)."""
        if self._placement is not None:
            self._placement.kill()

    # ---- the steps of execute ----

    def _choose_placement(self, ti: Any) -> Placement:
        spark = HorovodSparkSubmitHook(conn_id=self.spark_conn_id, deploy_mode=self.deploy_mode, conf=self.conf,
                                       on_application=lambda info: self._on_application(ti, info))
        return choose(spark, ConnectionSettings.of(self.hook))

    def _seal_payload(self, ti: Any, files: TryFiles, key: bytes) -> None:
        sealed = payload.seal(payload.dumps_call(self.python_callable, self.op_kwargs), key, payload.KIND_CALL)
        files.payload.parent.mkdir(parents=True, exist_ok=True)
        files.payload.write_bytes(sealed)
        ti.xcom_push(key="payload", value={"uri": str(files.payload), "size": len(sealed),
                                           "sha256": hashlib.sha256(sealed).hexdigest()})
        self.log.info("Payload (%d bytes) written to %s", len(sealed), files.payload)

    def _application(self, ti: Any, files: TryFiles, rank_env: dict[str, str],
                     timeline_path: ObjectStoragePath | None) -> Application:
        resume = resume_checkpoint(self.resume_from_checkpoint, files, self.checkpoint_path)
        if resume:
            rank_env[RESUME_FROM_ENV] = resume
            self.log.info("Resuming from checkpoint %s (step %d)", resume, checkpoint_step(resume))
        args = ["--payload", plain_url(files.payload), "--result", plain_url(files.result), "--np", str(self._np()),
                "--options", json.dumps(self.runner_options())]
        if timeline_path is not None:
            args += ["--timeline", plain_url(timeline_path)]
        return Application(args=args, rank_env=rank_env, name=f"horovod-{ti.dag_id}-{ti.task_id}", files=files,
                           conf=dict(self.conf), gpus_per_executor=self.gpus_per_executor,
                           gpu_discovery_script=self.gpu_discovery_script)

    def _submit(self, placement: Placement, app: Application, key: bytes) -> Submission:
        self.log.info("Submitting the Horovod application (np=%d) to %s", self._np(), placement.describe())
        with runner_message_first(app.files):
            return placement.submit(app, key)

    def _read_result(self, result_path: ObjectStoragePath, key: bytes) -> Any:
        return read_result(result_path, key, unpickle=self.unpickle_result,
                           key_outlives_run=self.hook.has_signing_key())

    # ---- what the task says while it runs ----

    def _publish_locations(self, ti: Any, files: TryFiles) -> tuple[dict[str, str], ObjectStoragePath | None]:
        """XCom (and links) for where this run's checkpoints and timeline go; the ranks' environment."""
        checkpoint_dir = ObjectStoragePath(self.checkpoint_path) if self.checkpoint_path else files.checkpoints
        ti.xcom_push(key="checkpoint_dir", value=str(checkpoint_dir))
        publish_link(self, ti, CheckpointsLink, str(checkpoint_dir))
        timeline_path = None
        if self.timeline:
            timeline_path = files.timeline if self.timeline is True else ObjectStoragePath(self.timeline)
            ti.xcom_push(key="timeline", value=str(timeline_path))
            publish_link(self, ti, HorovodTimelineLink, str(timeline_path))
            if self.runner_options().get("timeline_live_bytes", defaults.default("timeline_live_bytes")):
                ti.xcom_push(key="timeline_live", value=live_view_location(str(timeline_path)))
        return {**self.env, CHECKPOINT_DIR_ENV: plain_url(checkpoint_dir)}, timeline_path

    def _on_application(self, ti: Any, info: dict[str, Any]) -> None:
        ui = info.get("spark_ui")
        self.log.info("Spark application %s started; its UI: %s", info.get("application_id"),
                      ui or "disabled (spark.ui.enabled=false)")
        if ui:
            publish_link(self, ti, SparkUILink, str(ui))

    # ---- options ----

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
