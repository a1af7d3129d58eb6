"""The Airflow layer for real: `airflow dags test` / `airflow tasks test` on SQLite, Spark local[*], file storage."""

import asyncio
import datetime
import importlib
import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from conftest import assert_no_run_processes, rank_processes
from waiting import wait_for

REPO = Path(__file__).resolve().parent.parent
AIRFLOW = str(Path(sys.executable).parent / "airflow")


# Spark's log4j2 lines, as its pattern writes them: "26/12/04 09:42:56 INFO SparkContext: ...".
SPARK_LOG_LINE = re.compile(r"\d\d/\d\d/\d\d \d\d:\d\d:\d\d [A-Z]+ [\w$.]+: .*")


def run_airflow(airflow, *args, timeout=600, env=None):
    done = subprocess.run([AIRFLOW, *args], env={**airflow["env"], **(env or {})}, capture_output=True, text=True,
                          timeout=timeout)
    return done.returncode, done.stdout + done.stderr


def xcoms(airflow, dag_id, task_id):
    with sqlite3.connect(airflow["home"] / "airflow.db") as db:
        rows = db.execute("SELECT key, value FROM xcom WHERE dag_id = ? AND task_id = ?", (dag_id, task_id))
        return {key: json.loads(value) for key, value in rows}


def assert_digits_dag_trains(airflow, dag_id: str, epochs: int = 12) -> float:
    """`airflow dags test` of a digits example DAG: success, both ranks' logs, accuracy, XComs, artifacts.
    Returns the test accuracy."""
    rc, out = run_airflow(airflow, "dags", "test", dag_id, "-c", json.dumps({"epochs": epochs}))
    assert rc == 0, out[-5000:]
    assert "DagRun Finished" in out and "state=success" in out
    # Both ranks' lines reached the task log, live, with their prefixes.
    assert f"[0]<log>: epoch {epochs}:" in out and f"[1]<log>: epoch {epochs}:" in out
    accuracy = float(out.split("test accuracy ")[1].split()[0])
    assert accuracy > 0.9, out[-3000:]

    train = xcoms(airflow, dag_id, "train")
    assert train["return_value"]["epoch"] == epochs  # the templated kwarg was rendered (as an int)
    ref = train["payload"]
    payload_file = Path(ref["uri"].removeprefix("file://"))
    import hashlib
    assert hashlib.sha256(payload_file.read_bytes()).hexdigest() == ref["sha256"]
    assert payload_file.parent.name == "try-1"
    timeline = json.loads(Path(train["timeline"].removeprefix("file://")).read_text())
    assert any(e.get("name") == "ALLREDUCE" for e in timeline)
    # The live view sat beside it during training and was removed once the complete file was written.
    assert train["timeline_live"] == train["timeline"].removesuffix(".json") + ".live.json"
    assert not Path(train["timeline_live"].removeprefix("file://")).exists()
    # The task's links in the UI: Airflow reads them from these XCom keys.
    assert train["_link_HorovodTimelineLink"] == train["timeline"]
    assert train["_link_CheckpointsLink"] == train["checkpoint_dir"]
    assert re.fullmatch(r"http://[\w.-]+:\d+", train["_link_SparkUILink"]), train["_link_SparkUILink"]
    assert f"its UI: {train['_link_SparkUILink']}" in out
    # Timeline and checkpoints in the run's folder, which the sensor beside train watched; evaluate
    # took the newest checkpoint in it.
    run_dir = Path(train["payload"]["uri"].removeprefix("file://")).parents[2]
    assert train["timeline"] == f"file://{run_dir}/timeline.json", (train["timeline"], run_dir)
    assert train["checkpoint_dir"] == f"file://{run_dir}/checkpoints"
    found = xcoms(airflow, dag_id, "wait_for_artifacts")["return_value"]
    assert found["checkpoint"].endswith(f"ckpt-{epochs:010d}.pt") and found["timeline"] == train["timeline"]
    assert f"after {epochs} epochs" in out and f"of {train['checkpoint_dir']}/ckpt-{epochs:010d}.pt" in out
    return accuracy


def test_mnist_dag_trains_end_to_end(airflow, no_leftovers):
    assert_digits_dag_trains(airflow, "hvd_mnist_pytorch")


def test_tasks_test_runs_the_train_task_alone(airflow, no_leftovers):
    rc, out = run_airflow(airflow, "tasks", "test", "hvd_mnist_pytorch", "prepare")
    assert rc == 0, out[-3000:]
    rc, out = run_airflow(airflow, "tasks", "test", "-t", json.dumps({"epochs": 2}), "hvd_mnist_pytorch", "train")
    assert rc == 0, out[-5000:]
    assert "[1]<log>: epoch 2:" in out
    assert "Submitting the Horovod application (np=2) to Spark master local[*]" in out
    # A training log, not Spark's: none of its INFO start-up (issue 19 said about 60 lines), only the
    # line that says where its UI is.
    spark_info = SPARK_LOG_LINE.findall(out)
    assert [line for line in spark_info if " INFO " in line and " INFO SparkUI:" not in line] == [], spark_info
    assert any(" INFO SparkUI:" in line and "http://" in line for line in spark_info), out[-5000:]
    # The one switch back to Spark's INFO, documented in the operator.
    rc, out = run_airflow(airflow, "tasks", "test", "-t", json.dumps({"epochs": 1, "spark_log_level": "INFO"}),
                          "hvd_mnist_pytorch", "train")
    assert rc == 0, out[-5000:]
    assert len([line for line in SPARK_LOG_LINE.findall(out) if " INFO " in line]) > 20, out[-5000:]


@pytest.mark.faults
def test_on_kill_stops_spark_and_every_rank(airflow, fault):
    """The task's process dies without a word (SIGKILL, as an OOM kill), so no on_kill runs: the
    driver, on this host in client mode, sees its task gone and ends the application, so that the
    task's retry does not train beside an orphan. (Airflow's SIGTERM and on_kill, from a user marking
    the task failed, are test_production_shape's, on the deployment.)"""
    how = "SIGKILL"
    record = fault("The training task's process dies without on_kill (SIGKILL, as an OOM kill), client mode",
                   "the driver sees its task gone: spark-submit, the application and every rank end in 10 s")
    assert_no_run_processes()
    rc, out = run_airflow(airflow, "tasks", "test", "hvd_mnist_pytorch", "prepare")
    assert rc == 0, out[-3000:]
    proc = subprocess.Popen([AIRFLOW, "tasks", "test", "-t", json.dumps({"epochs": 100000}), "hvd_mnist_pytorch",
                             "train"], env=airflow["env"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    try:
        wait_for("both ranks of the training task to start", lambda: len(rank_processes()) == 2, 120,
                 seen=rank_processes, process=proc)
        time.sleep(2)  # well into training
        # The task's links are in the UI while it runs, not only once it ends.
        links = {key: value for key, value in xcoms(airflow, "hvd_mnist_pytorch", "train").items()
                 if key.startswith("_link_")}
        assert set(links) == {"_link_SparkUILink", "_link_CheckpointsLink", "_link_HorovodTimelineLink"}, links
        assert links["_link_SparkUILink"].startswith("http://")
        record.start()
        proc.send_signal(getattr(signal, how))
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:  # an assertion above failed: end the task as Airflow does, not with SIGKILL
            proc.send_signal(signal.SIGTERM)
            try:
                proc.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
    assert_no_run_processes(timeout=10)
    import psutil

    def left():
        return [p.info["cmdline"] for p in psutil.process_iter(["cmdline"])
                if any("spark_app.py" in part or "SparkSubmit" in part for part in (p.info["cmdline"] or []))]

    wait_for(f"spark-submit and the Spark application to end after the task's {how}", lambda: not left(), 10,
             interval=0.2, seen=left)
    record.observe("the driver ended spark-submit, the application and every rank", record.failed_after())


def test_tampered_payload_is_refused_before_unpickling(tmp_path):
    from airflow_provider_hvd.runner.wire import payload

    key = payload.new_secret()
    marker = tmp_path / "pwned"
    sealed = bytearray(payload.seal(payload.dumps_call(print, {}), key, payload.KIND_CALL))
    sealed[-3] ^= 0xFF
    (tmp_path / "payload.hvd").write_bytes(bytes(sealed))
    env = {**os.environ, "HVD_SIGNING_KEY": key.hex()}
    done = subprocess.run([sys.executable, str(REPO / "airflow_provider_hvd/runner/spark_app.py"),
                           "--payload", f"file://{tmp_path}/payload.hvd", "--result", f"file://{tmp_path}/result.hvd",
                           "--np", "2"], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    report = json.loads((tmp_path / "result.hvd.error.json").read_text())
    assert report["type"] == "PayloadError" and "tampered" in report["message"]
    assert not marker.exists() and not (tmp_path / "result.hvd").exists()


@pytest.mark.faults
def test_tampered_or_foreign_result_is_refused_by_the_operator(tmp_path, fault):
    record = fault("rank 0's result in storage signed with another key, then truncated (operator side)",
                   "the operator refuses it before unpickling, naming which check failed")
    from airflow.sdk import ObjectStoragePath
    from airflow.sdk.exceptions import AirflowException

    from airflow_provider_hvd.operators.horovod_runner import HorovodRunnerOperator
    from airflow_provider_hvd.runner.results import seal_result
    from airflow_provider_hvd.runner.wire import payload

    op = HorovodRunnerOperator(task_id="t", python_callable=print, np=2)
    key = payload.new_secret()
    path = ObjectStoragePath(f"file://{tmp_path}/result.hvd")
    path.write_bytes(seal_result({"loss": 0.1}, key))
    assert op._read_result(path, key) == {"loss": 0.1}
    with pytest.raises(AirflowException, match="signed with another key"):
        op._read_result(path, payload.new_secret())
    path.write_bytes(path.read_bytes()[:-4])
    with pytest.raises(AirflowException, match="truncated") as info:
        op._read_result(path, key)
    record.observe(f"signed with another key -> refused; truncated -> {str(info.value)[:160]}")


def test_a_spark_connection_that_does_not_exist_fails_the_task_before_anything_is_written(airflow, tmp_path):
    env = {key: value for key, value in airflow["env"].items() if key != "AIRFLOW_CONN_SPARK_DEFAULT"}
    env.update({"AIRFLOW__CORE__DAGS_FOLDER": str(REPO / "tests" / "dags"),
                "AIRFLOW_CONN_HOROVOD_DEFAULT": json.dumps({"conn_type": "horovod",
                                                            "extra": {"storage_path": f"file://{tmp_path}/storage"}})})
    done = subprocess.run([AIRFLOW, "tasks", "test", "hvd_concurrent_runs", "train"], env=env, capture_output=True,
                          text=True, timeout=300)
    out = done.stdout + done.stderr
    assert "new_state=failed" in out, out[-3000:]  # (`tasks test` itself exits 0 either way)
    assert "Spark connection 'spark_default' does not exist" in out and "spark_conn_id=None" in out, out[-3000:]
    assert not (tmp_path / "storage").exists()  # no payload written, so nothing was submitted either


def test_a_result_that_is_not_json_reaches_a_downstream_task_through_load_result(airflow, tmp_path, no_leftovers):
    from airflow_provider_hvd.runner.wire import payload

    conn = {"conn_type": "horovod", "password": payload.new_secret().hex(),
            "extra": {"storage_path": f"file://{tmp_path}/storage"}}
    rc, out = run_airflow(airflow, "dags", "test", "hvd_result_downstream", env={
        "AIRFLOW_CONN_HOROVOD_DEFAULT": json.dumps(conn),
        "AIRFLOW__CORE__DAGS_FOLDER": str(REPO / "tests" / "dags")})
    assert rc == 0 and "state=success" in out, out[-5000:]
    uri = xcoms(airflow, "hvd_result_downstream", "train")["return_value"]
    assert uri.startswith(f"file://{tmp_path}/storage/") and uri.endswith("/result.hvd")
    assert "Rank 0's result is not JSON" in out and "load_result" in out
    got = xcoms(airflow, "hvd_result_downstream", "evaluate")["return_value"]
    assert got == {"type": "ndarray", "weights": [0.0, 1.5, 3.0, 4.5]}  # (1x + 2x) / 2, from the ranks


class UnpickleTrace:
    """Leaves a folder in ``where`` each time it is unpickled."""

    def __init__(self, where):
        self.where = str(where)

    def __reduce__(self):
        import tempfile

        return tempfile.mkdtemp, ("", "unpickled-", self.where)


def test_the_operator_leaves_a_pickled_result_unpickled_unless_asked(monkeypatch, tmp_path):
    from airflow.sdk import ObjectStoragePath

    from airflow_provider_hvd.operators.horovod_runner import HorovodRunnerOperator
    from airflow_provider_hvd.runner.results import seal_result
    from airflow_provider_hvd.runner.wire import payload

    key = payload.new_secret()
    monkeypatch.setenv("AIRFLOW_CONN_HOROVOD_DEFAULT", json.dumps({"conn_type": "horovod", "password": key.hex()}))
    path = ObjectStoragePath(f"file://{tmp_path}/result.hvd")
    path.write_bytes(seal_result({"trace": UnpickleTrace(tmp_path)}, key))
    assert HorovodRunnerOperator(task_id="t", python_callable=print, np=2)._read_result(path, key) == str(path)
    assert not list(tmp_path.glob("unpickled-*"))
    with pytest.raises(Exception, match="signed with another key"):  # the key id is checked all the same
        HorovodRunnerOperator(task_id="t", python_callable=print, np=2)._read_result(path, payload.new_secret())
    value = HorovodRunnerOperator(task_id="t", python_callable=print, np=2,
                                  unpickle_result=True)._read_result(path, key)
    assert [Path(value["trace"])] == list(tmp_path.glob("unpickled-*"))


def test_the_operator_reads_a_result_in_object_storage_through_a_connection_or_without_one(monkeypatch, s3_server,
                                                                                          s3_bucket):
    """Rank 0's result read from S3 (moto's server, a stand-in for a bucket): through Airflow's filesystem for a
    path that names a connection (``s3://<conn_id>@bucket/...``), else through the client this process already
    has for the URL, whose listing of the folder, made before the driver wrote the result, is not trusted."""
    import fsspec
    import s3fs
    from airflow.sdk import ObjectStoragePath

    from airflow_provider_hvd.operators.horovod_runner import HorovodRunnerOperator
    from airflow_provider_hvd.runner.results import seal_result
    from airflow_provider_hvd.runner.wire import payload

    monkeypatch.setenv("AIRFLOW_CONN_HVD_S3", json.dumps({
        "conn_type": "aws", "login": "testing", "password": "testing",
        "extra": {"endpoint_url": s3_server, "region_name": "us-east-1"}}))
    key = payload.new_secret()
    op = HorovodRunnerOperator(task_id="t", python_callable=print, np=2)
    for url, value in ((f"s3://{s3_bucket}/plain/try-1", {"loss": 0.25}),
                       (f"s3://hvd_s3@{s3_bucket}/named/try-1", {"loss": 0.5})):
        prefix = ObjectStoragePath(url)
        (prefix / "payload.hvd").write_bytes(b"sealed call")
        fsspec.filesystem("s3").ls(f"{s3_bucket}/{prefix.key}")  # listed (and cached) before the result exists
        driver = s3fs.S3FileSystem(skip_instance_cache=True)  # the driver, on another host
        driver.pipe(f"{s3_bucket}/{prefix.key}/result.hvd", seal_result(value, key))
        assert op._read_result(prefix / "result.hvd", key) == value, url


def test_load_result_verifies_with_the_connections_key_and_says_how_to_get_one(monkeypatch, tmp_path):
    import numpy as np

    from airflow_provider_hvd.hooks.horovod import load_result
    from airflow_provider_hvd.runner.errors import PayloadError
    from airflow_provider_hvd.runner.results import seal_result
    from airflow_provider_hvd.runner.wire import payload

    key = payload.new_secret()
    path = tmp_path / "result.hvd"
    path.write_bytes(seal_result({"w": np.ones(3)}, key))
    monkeypatch.setenv("AIRFLOW_CONN_HVD_KEYED", json.dumps({"conn_type": "horovod", "password": key.hex()}))
    assert load_result(f"file://{path}", horovod_conn_id="hvd_keyed")["w"].tolist() == [1.0, 1.0, 1.0]
    monkeypatch.setenv("AIRFLOW_CONN_HVD_OTHER", json.dumps({"conn_type": "horovod",
                                                             "password": payload.new_secret().hex()}))
    with pytest.raises(PayloadError, match="signed with another key"):
        load_result(f"file://{path}", horovod_conn_id="hvd_other")
    path.write_bytes(path.read_bytes()[:-1] + b"x")
    with pytest.raises(PayloadError, match="tampered"):
        load_result(f"file://{path}", horovod_conn_id="hvd_keyed")
    monkeypatch.setenv("AIRFLOW_CONN_HVD_KEYLESS", json.dumps({"conn_type": "horovod"}))
    with pytest.raises(ValueError, match="has no signing key.*token_hex"):
        load_result(f"file://{path}", horovod_conn_id="hvd_keyless")
    # JSON values come back as JSON, large ones the pickle's way.
    from airflow_provider_hvd.runner.results import JSON_RESULT_MAX_BYTES, result_kind

    assert result_kind(seal_result({"a": 1}, key)[:payload.HEADER_SIZE], key) == payload.KIND_JSON_RESULT
    big = seal_result("x" * JSON_RESULT_MAX_BYTES, key)
    assert result_kind(big[:payload.HEADER_SIZE], key) == payload.KIND_RESULT


def test_runner_options_come_from_the_operator_then_the_connection_then_the_defaults(monkeypatch):
    from airflow_provider_hvd.operators.horovod_runner import HorovodRunnerOperator
    from airflow_provider_hvd.runner import spark_app

    monkeypatch.setenv("AIRFLOW_CONN_HOROVOD_DEFAULT", json.dumps({"conn_type": "horovod", "extra": {
        "max_restarts": 3, "stall_timeout": "none", "extra__horovod__slot_wait_timeout": "300",
        "mpi_args": "-mca btl tcp,self"}}))
    op = HorovodRunnerOperator(task_id="t", python_callable=print, np=2, stall_timeout=45, timeout="none")
    options = op.runner_options()
    assert options == {"max_restarts": 3, "slot_wait_timeout": 300.0, "mpi_args": ["-mca", "btl", "tcp,self"],
                       "stall_timeout": 45.0, "timeout": None}
    # What the Spark application receives, parsed as it parses it, reaches HorovodRunner's arguments.
    parsed = spark_app.parse_args(["--payload", "p", "--result", "r", "--np", "2", "--options", json.dumps(options)])
    assert parsed.options == {**options, "mpi_args": ("-mca", "btl", "tcp,self")}
    # Templated values, as rendering without native objects leaves them.
    templated = HorovodRunnerOperator(task_id="t", python_callable=print, np="{{ params.np }}",
                                      max_restarts="{{ params.r }}")
    templated.np, templated.max_restarts = "-2", "1"
    assert templated._np() == -2 and templated.runner_options()["max_restarts"] == 1
    templated.np = "two"
    with pytest.raises(TypeError, match="np rendered to 'two'"):
        templated._np()
    templated.max_restarts = "many"
    with pytest.raises(ValueError, match="argument max_restarts: max_restarts takes an int >= 0"):
        templated.runner_options()
    # Bad values fail when the DAG is parsed, naming the option.
    with pytest.raises(ValueError, match="max_restarts takes an int >= 0.*got -2"):
        HorovodRunnerOperator(task_id="t", python_callable=print, np=2, max_restarts=-2)
    with pytest.raises(ValueError, match="stall_timeout takes a number of seconds > 0 or 'none'"):
        HorovodRunnerOperator(task_id="t", python_callable=print, np=2, stall_timeout="soon")
    monkeypatch.setenv("AIRFLOW_CONN_HOROVOD_DEFAULT", json.dumps({"conn_type": "horovod",
                                                                    "extra": {"launcher": "ssh"}}))
    with pytest.raises(ValueError, match="field of connection 'horovod_default' launcher: launcher='ssh'"):
        HorovodRunnerOperator(task_id="t", python_callable=print, np=2).runner_options()


def test_sensor_pokes_then_defers_and_trigger_fires(tmp_path):
    from airflow.sdk.exceptions import TaskDeferred

    from airflow_provider_hvd.runner.checkpoint import save_checkpoint
    from airflow_provider_hvd.sensors.horovod_artifact import HorovodArtifactSensor
    from airflow_provider_hvd.triggers.horovod_artifact import HorovodArtifactTrigger

    ckpts, timeline = tmp_path / "ckpts", tmp_path / "timeline.json"
    since = datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(seconds=1)
    sensor = HorovodArtifactSensor(task_id="wait", timeline_path=f"file://{timeline}",
                                   checkpoint_dir=f"file://{ckpts}", newer_than=since.isoformat(),
                                   deferrable=True, poke_interval=0.2)
    assert not sensor.poke({}).is_done
    with pytest.raises(TaskDeferred) as deferred:
        sensor.execute({})
    trigger = deferred.value.trigger
    classpath, kwargs = trigger.serialize()
    assert classpath == "airflow_provider_hvd.triggers.horovod_artifact.HorovodArtifactTrigger"
    rebuilt = importlib.import_module(classpath.rsplit(".", 1)[0]).HorovodArtifactTrigger(**kwargs)
    assert rebuilt.serialize() == (classpath, kwargs) and kwargs["newer_than"] == since.isoformat()

    def produce():
        time.sleep(0.5)
        timeline.write_text("[]")
        save_checkpoint({"step": 1}, str(ckpts), step=1)
        save_checkpoint({"step": 2}, str(ckpts), step=2)

    threading.Thread(target=produce).start()

    async def first_event():
        async for event in rebuilt.run():
            return event.payload

    event = asyncio.run(asyncio.wait_for(first_event(), timeout=20))
    assert event["status"] == "success"
    assert event["found"]["checkpoint"].endswith("ckpt-0000000002.pt")
    assert sensor.execute_complete({}, event) == event["found"]
    # Now the first poke succeeds: no deferral, the paths come straight back.
    assert sensor.execute({}) == event["found"]
    # Artifacts older than newer_than do not count.
    later = HorovodArtifactSensor(task_id="w2", checkpoint_dir=str(ckpts),
                                  newer_than=(datetime.datetime.now(datetime.timezone.utc)
                                              + datetime.timedelta(minutes=1)).isoformat())
    assert not later.poke({}).is_done
    assert isinstance(HorovodArtifactTrigger(checkpoint_dir="x").serialize()[1]["poke_interval"], float)

    # end_from_trigger: the triggerer ends the task, what was found pushed as its return_value.
    ending = HorovodArtifactSensor(task_id="w3", checkpoint_dir=str(ckpts), deferrable=True, end_from_trigger=True,
                                   newer_than=(datetime.datetime.now(datetime.timezone.utc)
                                               + datetime.timedelta(minutes=1)).isoformat())
    with pytest.raises(TaskDeferred) as deferred:
        ending.execute({})
    classpath, kwargs = deferred.value.trigger.serialize()
    assert kwargs["end_from_trigger"] is True
    kwargs["newer_than"] = None  # what is there now counts
    from airflow.triggers.base import TaskSuccessEvent
    ended = asyncio.run(asyncio.wait_for(_first_event(HorovodArtifactTrigger(**kwargs)), timeout=20))
    assert isinstance(ended, TaskSuccessEvent)
    assert list(ended.xcoms) == ["return_value"] and list(ended.xcoms["return_value"]) == ["checkpoint"]
    assert ended.xcoms["return_value"]["checkpoint"] == str(ckpts / "ckpt-0000000002.pt")


async def _first_event(trigger):
    async for event in trigger.run():
        return event


def test_every_class_the_provider_lists_is_importable():
    from airflow_provider_hvd.get_provider_info import get_provider_info

    info = get_provider_info()
    modules = [m for kind in ("hooks", "operators", "sensors", "triggers") for entry in info[kind]
               for m in entry["python-modules"]]
    package = Path(__file__).resolve().parent.parent / "airflow_provider_hvd"
    on_disk = sorted(f"airflow_provider_hvd.{kind}.{p.stem}" for kind in ("hooks", "operators", "sensors", "triggers")
                     for p in (package / kind).glob("*.py") if p.stem != "__init__" and
                     (kind != "operators" or p.stem == "horovod_runner"))  # operators/ also holds its helpers
    assert sorted(modules) == on_disk  # every hook, operator, sensor and trigger module, and nothing else
    for module in modules:
        importlib.import_module(module)
    for conn in info["connection-types"]:
        module, cls = conn["hook-class-name"].rsplit(".", 1)
        hook = getattr(importlib.import_module(module), cls)
        assert hook.conn_type == conn["connection-type"] == "horovod"
    from airflow_provider_hvd.operators.horovod_runner import HorovodRunnerOperator

    declared = info["extra-links"]
    assert [f"{type(link).__module__}.{type(link).__name__}" for link in HorovodRunnerOperator.operator_extra_links
            ] == declared


PROVIDERS_MANAGER_PROBE = """
import json, warnings
from airflow.providers_manager import ProvidersManager
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    pm = ProvidersManager()
    widgets = {name: {"label": w.field["schema"].get("title"), "field_name": w.field_name}
               for name, w in pm.connection_form_widgets.items() if name.startswith("extra__horovod__")}
    behaviour = pm.field_behaviours.get("horovod")
    hook = pm.hooks.get("horovod")
    links = [name for name in pm.extra_links_class_names if name.startswith("airflow_provider_hvd.")]
print("PROBE " + json.dumps({"widgets": widgets, "behaviour": behaviour, "links": links,
                             "hook_name": hook.hook_name if hook else None,
                             "deprecations": [str(w.message) for w in caught if "airflow_provider_hvd" in str(w.message)]}))
"""


def test_the_connection_form_is_declared_for_airflows_ui(airflow):
    # Airflow's own providers manager, in a process of its own, reads the form from provider info.
    done = subprocess.run([sys.executable, "-c", PROVIDERS_MANAGER_PROBE], env=airflow["env"], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    probe = json.loads(done.stdout.split("PROBE ", 1)[1])
    assert probe["hook_name"] == "Horovod"
    from airflow_provider_hvd.runner import defaults

    assert {w["field_name"] for w in probe["widgets"].values()} == {
        "storage_path", "kubernetes_secret", "cluster_spark_app", "cluster_spark_jar", *defaults.OPTIONS}
    assert probe["widgets"]["extra__horovod__max_restarts"]["label"] == "Max restarts"
    assert probe["behaviour"]["hidden_fields"] == ["host", "schema", "login", "port"]
    assert probe["behaviour"]["relabeling"] == {"password": "Signing key (hex)"}
    assert probe["behaviour"]["placeholders"]["extra__horovod__storage_path"].startswith("s3://")
    assert probe["deprecations"] == []
    assert probe["links"] == ["airflow_provider_hvd.links.horovod.CheckpointsLink",
                              "airflow_provider_hvd.links.horovod.HorovodTimelineLink",
                              "airflow_provider_hvd.links.horovod.SparkUILink"]  # as Airflow's UI finds them


def test_the_hook_reads_exactly_the_declared_fields_as_json_or_as_the_ui_saves_them(monkeypatch):
    from airflow_provider_hvd.hooks.horovod import HorovodHook

    monkeypatch.setenv("AIRFLOW_CONN_HOROVOD_UI", json.dumps({"conn_type": "horovod", "extra": {
        "extra__horovod__launcher": "gloo", "max_restarts": 2, "driver_log_verbosity": ""}}))
    hook = HorovodHook("horovod_ui")
    assert hook.setting("launcher", "auto") == "gloo"
    assert hook.setting("max_restarts", 0) == 2
    assert hook.setting("driver_log_verbosity", "all") == "all"  # left empty in the form: the default
    with pytest.raises(KeyError, match="'mpi_arg' is not a field of the horovod connection"):
        hook.setting("mpi_arg", None)


@pytest.mark.faults
def test_retry_resumes_from_the_failed_tries_checkpoint(airflow, no_leftovers, fault):
    record = fault("the training task's first try dies after checkpoint 7 (`airflow dags test`, retries=1)",
                   "the retry resumes from the failed try's newest checkpoint")
    env = {**airflow["env"], "AIRFLOW__CORE__DAGS_FOLDER": str(REPO / "tests" / "dags")}
    done = subprocess.run([AIRFLOW, "dags", "test", "hvd_retry_resume"], env=env, capture_output=True, text=True,
                          timeout=600)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-5000:]
    assert "first try dies after its checkpoint" in out
    result = xcoms(airflow, "hvd_retry_resume", "train")["return_value"]
    assert result["resumed_from_step"] == 7
    assert "/train/try-1/checkpoints/ckpt-0000000007.pt" in result["resume"]
    record.observe(f"try 2 resumed from step {result['resumed_from_step']} ({result['resume'].rsplit('/', 3)[-3]}"
                   "/checkpoints/ckpt-0000000007.pt)")


def test_signing_key_and_storage_come_from_the_horovod_connection(airflow, tmp_path, no_leftovers):
    from airflow_provider_hvd.runner.wire import payload

    key = payload.new_secret()
    conn = {"conn_type": "horovod", "password": key.hex(),
            "extra": {"storage_path": f"file://{tmp_path}/from-connection", "launcher": "gloo"}}
    env = {**airflow["env"], "AIRFLOW_CONN_HOROVOD_DEFAULT": json.dumps(conn),
           "AIRFLOW__CORE__DAGS_FOLDER": str(REPO / "tests" / "dags")}
    done = subprocess.run([AIRFLOW, "tasks", "test", "hvd_retry_resume", "train"], env=env, capture_output=True,
                          text=True, timeout=600)
    out = done.stdout + done.stderr
    # The first try of this DAG fails on purpose; what matters is where and how it signed.
    payloads = list((tmp_path / "from-connection").rglob("payload.hvd"))
    assert len(payloads) == 1, out[-3000:]
    header = payloads[0].read_bytes()[:18]
    assert header[10:18] == payload.key_fingerprint(key)  # signed with the connection's key
    assert key.hex() not in out  # and the key is never logged
    assert "(gloo)" in out  # the connection's launcher default


@pytest.mark.faults
def test_two_dag_runs_at_once_do_not_collide(airflow, no_leftovers, fault):
    record = fault("two runs of one DAG at once (`airflow dags test` x2, two Spark applications on one machine)",
                   "both succeed, each with its own storage prefix, checkpoints, ports and ranks")
    env = {**airflow["env"], "AIRFLOW__CORE__DAGS_FOLDER": str(REPO / "tests" / "dags")}
    dates = ["2026-03-01T00:00:00+00:00", "2026-03-02T00:00:00+00:00"]
    # Serialise the DAG once first: two `dags test` writing the same new DAG into SQLite at the
    # same instant is a race of the metadata DB, not of the runs under test.
    done = subprocess.run([AIRFLOW, "dags", "reserialize"], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    t0 = time.monotonic()
    procs = [subprocess.Popen([AIRFLOW, "dags", "test", "hvd_concurrent_runs", d], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for d in dates]
    outs = [p.communicate(timeout=600)[0] for p in procs]
    seconds = time.monotonic() - t0
    for p, out in zip(procs, outs):
        assert p.returncode == 0, out[-5000:]
    with sqlite3.connect(airflow["home"] / "airflow.db") as db:
        rows = db.execute("SELECT run_id, key, value FROM xcom WHERE dag_id = 'hvd_concurrent_runs' "
                          "AND task_id = 'train'").fetchall()
    by_run = {}
    for run_id, key, value in rows:
        by_run.setdefault(run_id, {})[key] = json.loads(value)
    assert len(by_run) == 2
    results = {run_id: x["return_value"] for run_id, x in by_run.items()}
    assert all(r["sum"] == 3.0 and r["marker"] == run_id for run_id, r in results.items())
    payloads = {x["payload"]["uri"] for x in by_run.values()}
    checkpoints = {r["checkpoint_dir"] for r in results.values()}
    assert len(payloads) == 2 and len(checkpoints) == 2
    assert all(run_id in r["checkpoint_dir"] for run_id, r in results.items())
    record.observe(f"both succeeded in {seconds:.0f} s together; payload prefixes and checkpoint directories "
                   "differ by run_id; each run's driver service and ranks were its own")


@pytest.mark.faults
def test_an_executor_lost_under_airflow_is_restarted_within_the_first_try(airflow, tmp_path, no_leftovers, fault):
    import psutil

    record = fault("the executor holding rank 1 SIGKILLed mid-training under `airflow dags test` (Spark "
                   "local-cluster[2,1,1024], max_restarts=2)",
                   "the task restarts its ranks from the last checkpoint and succeeds in its first try")
    markers = tmp_path / "markers"
    markers.mkdir()
    spark = {"conn_type": "spark", "host": "local-cluster[2,1,1024]"}
    env = {**airflow["env"], "AIRFLOW__CORE__DAGS_FOLDER": str(REPO / "tests" / "dags"),
           "AIRFLOW_CONN_SPARK_LOCAL_CLUSTER": json.dumps(spark), "HVD_TEST_MARKERS": str(markers),
           # local-cluster would bind to this machine's first real interface; keep it on loopback.
           "SPARK_LOCAL_IP": "127.0.0.1"}
    proc = subprocess.Popen([AIRFLOW, "dags", "test", "hvd_executor_lost"], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    output = []
    reader = threading.Thread(target=lambda: output.extend(proc.stdout), daemon=True)
    reader.start()
    try:
        marker = markers / "attempt-0-rank-1.pid"
        wait_for(f"rank 1 to reach training ({marker.name})", marker.exists, 300, interval=0.1,
                 seen=lambda: "".join(output)[-5000:], process=proc)
        time.sleep(1.0)  # a few steps and checkpoints in
        rank = psutil.Process(int(marker.read_text()))
        executor = next(p for p in rank.parents() if "CoarseGrainedExecutorBackend" in " ".join(p.cmdline()))
        record.start()
        executor.kill()
        rc = proc.wait(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        reader.join(10)
    out = "".join(output)
    assert rc == 0, out[-6000:]
    assert "Restarting the 2 ranks (restart 1 of 2)" in out and "lost executor (rank 1" in out, out[-6000:]
    result = xcoms(airflow, "hvd_executor_lost", "train")["return_value"]
    assert result["attempt"] == 1 and 0 < result["resumed_from_step"] < result["steps"], result
    assert "/train/try-1/checkpoints/ckpt-" in result["resume"]
    with sqlite3.connect(airflow["home"] / "airflow.db") as db:
        tries = db.execute("SELECT state, try_number FROM task_instance WHERE dag_id = 'hvd_executor_lost'").fetchall()
    assert tries == [("success", 1)], tries
    record.observe(f"succeeded in try 1 after one restart, resuming from step {result['resumed_from_step']} of "
                   f"{result['steps']}")
