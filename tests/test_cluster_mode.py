"""Standalone cluster deploy mode: the Spark driver runs on a worker, and the Airflow task follows it.

The training itself, with the driver's output reaching the task log through storage, is in
tests/test_key_secrecy.py (``standalone-cluster``), which also checks where the key went. Here:
killing the Airflow task kills the driver on the cluster and every rank, and a driver that ends
without a result fails the task with the runner's own message.
"""

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import psutil
import pytest
from conftest import assert_no_run_processes, rank_processes
from spark_cluster import StandaloneCluster
from test_key_secrecy import DRIVER_WRAPPER, cluster_mode_environment

REPO = Path(__file__).resolve().parent.parent
AIRFLOW = str(Path(sys.executable).parent / "airflow")


@pytest.fixture
def cluster(tmp_path):
    (tmp_path / "cluster").mkdir()
    # The driver takes a core and 1 GiB of its worker: room for an executor beside it.
    spark = StandaloneCluster(tmp_path / "cluster", cores_per_worker=2, memory="2g", rest=True).start()
    yield spark
    spark.stop()


def task_env(airflow, tmp_path, cluster, s3_bucket, **extra) -> dict:
    from airflow_provider_hvd.runner.wire import payload

    return {**airflow["env"], "AIRFLOW__CORE__DAGS_FOLDER": str(REPO / "tests" / "dags"),
            **cluster_mode_environment(s3_bucket, payload.new_secret().hex()),
            "AIRFLOW_CONN_SPARK_TEST": json.dumps(cluster.connection()), "HVD_TEST_SPARK_CONN": "spark_test",
            "HVD_TEST_MARKERS": str(tmp_path), "HVD_TEST_EVENT_LOG": f"file://{tmp_path}",
            "SPARK_LOCAL_IP": "127.0.0.1",
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
            "PYSPARK_PYTHON": sys.executable, **extra}


def driver_processes() -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        cmdline = " ".join(proc.info["cmdline"] or [])
        if DRIVER_WRAPPER in cmdline or "spark_app.py" in cmdline:
            found.append(proc)
    return found


def driver_state(cluster, driver_id: str) -> str:
    url = f"http://127.0.0.1:{cluster.rest_port}/v1/submissions/status/{driver_id}"
    with urllib.request.urlopen(url, timeout=10) as reply:
        return json.loads(reply.read()).get("driverState", "NOT_FOUND")


@pytest.mark.faults
def test_killing_the_task_kills_the_driver_on_the_cluster_and_every_rank(airflow, tmp_path, cluster, s3_bucket,
                                                                        fault, no_leftovers):
    record = fault("Airflow kills a training task whose Spark driver runs on the cluster (standalone cluster mode)",
                   "the driver is killed through the master; it and every rank end within 10 s")
    env = task_env(airflow, tmp_path, cluster, s3_bucket, HVD_TEST_SECONDS="600")
    proc = subprocess.Popen([AIRFLOW, "tasks", "test", "hvd_key_secrecy", "train"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 180
        while len(list(tmp_path.glob("rank-*.pid"))) < 2 and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.5)
        if len(list(tmp_path.glob("rank-*.pid"))) < 2:
            proc.terminate()
            raise AssertionError("the ranks never started:\n" + proc.communicate(timeout=60)[0][-5000:])
        assert len(rank_processes()) == 2 and driver_processes()
        driver_dirs = list((tmp_path / "cluster").glob("work*/driver-*"))
        assert len(driver_dirs) == 1, driver_dirs  # the driver runs on a worker, not here
        driver_id = driver_dirs[0].name
        assert driver_state(cluster, driver_id) == "RUNNING"
        record.start()
        proc.send_signal(signal.SIGTERM)  # what Airflow sends a task it kills
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
    assert f"Asked the Spark master to kill driver {driver_id}" in out, out[-4000:]
    assert_no_run_processes(timeout=10)
    deadline = time.monotonic() + 10
    while driver_processes() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not driver_processes(), [p.info["cmdline"] for p in driver_processes()]
    seconds = record.failed_after()
    assert driver_state(cluster, driver_id) == "KILLED"
    record.observe(f"the master killed driver {driver_id}; no rank, orted or driver process left", seconds)


def test_a_driver_that_fails_fails_the_task_with_the_runners_message(airflow, tmp_path, cluster, s3_bucket,
                                                                     no_leftovers):
    """np larger than the cluster can ever hold: the runner's own error, from the driver on the cluster."""
    env = task_env(airflow, tmp_path, cluster, s3_bucket, HVD_TEST_NP="9", HVD_TEST_SLOT_WAIT="2")
    done = subprocess.run([AIRFLOW, "tasks", "test", "hvd_key_secrecy", "train"], env=env, capture_output=True,
                          text=True, timeout=300)
    out = done.stdout + done.stderr
    assert "new_state=failed" in out, out[-4000:]
    assert "Spark driver driver-" in out and ": FAILED" in out, out[-4000:]
    # The runner's message, shipped from the driver's error report, is the task's error.
    assert "HorovodRunner(np=9) needs 9 task slots at once" in out, out[-4000:]


def test_deferrable_hands_the_running_driver_to_a_trigger_and_resumes_with_rank_0s_value(airflow, tmp_path, cluster,
                                                                                       s3_bucket, no_leftovers):
    """`airflow dags test` runs the trigger in its own process, as the triggerer would: the task defers once
    the driver is placed, the trigger relays the driver's output, the task resumes and verifies the result."""
    env = task_env(airflow, tmp_path, cluster, s3_bucket, HVD_TEST_DEFERRABLE="1")
    done = subprocess.run([AIRFLOW, "dags", "test", "hvd_key_secrecy"], env=env, capture_output=True, text=True,
                          timeout=600)
    out = done.stdout + done.stderr
    assert done.returncode == 0 and "state=success" in out, out[-5000:]
    assert "handing this task to the triggerer" in out and "HorovodDriverTrigger" in out, out[-5000:]
    assert "rank 0 did" in out and "rank 1 did" in out, out[-5000:]  # relayed by the trigger
    assert "Rank 0 returned {'size': 2" in out, out[-5000:]


@pytest.mark.faults
def test_a_deferred_training_survives_the_airflow_side_being_killed_and_restarted(tmp_path, cluster, s3_bucket, fault,
                                                                                 no_leftovers):
    """Airflow as deployed (scheduler with LocalExecutor, triggerer, ... on PostgreSQL): the training task
    defers while its driver runs on the cluster; the scheduler (with its executor's workers) and the
    triggerer are SIGKILLed mid-training and started again; the task completes with rank 0's value and
    no second training starts."""
    from airflow_services import AirflowServices, cli, service_env
    from postgres_server import PostgresServer

    record = fault("The scheduler (with its task workers) and the triggerer die while a deferred training runs",
                   "once restarted, the trigger follows the same driver; the task completes, no second training")
    home = tmp_path / "airflow"
    deployment = {k: v for k, v in task_env({"env": {}}, tmp_path, cluster, s3_bucket, HVD_TEST_DEFERRABLE="1",
                                            HVD_TEST_SECONDS="45").items() if k != "AIRFLOW__CORE__DAGS_FOLDER"}
    with PostgresServer() as postgres:
        env = service_env(home, REPO / "tests" / "dags", AIRFLOW__DATABASE__SQL_ALCHEMY_CONN=postgres.url,
                          **deployment)
        cli(env, "db", "migrate")
        cli(env, "dags", "reserialize")
        with AirflowServices(env, tmp_path / "service-logs") as airflow:
            airflow.api("PATCH", "/dags/hvd_key_secrecy", {"is_paused": False})
            run_id = airflow.api("POST", "/dags/hvd_key_secrecy/dagRuns", {"logical_date": None})["dag_run_id"]
            ti_path = f"/dags/hvd_key_secrecy/dagRuns/{run_id}/taskInstances/train"
            deadline = time.monotonic() + 240
            while time.monotonic() < deadline:
                state = airflow.api("GET", ti_path)["state"]
                if state == "deferred" and len(list(tmp_path.glob("rank-*.pid"))) == 2:
                    break
                assert state not in ("failed", "success"), (state, airflow.log("scheduler")[-3000:])
                time.sleep(1)
            else:
                raise AssertionError(f"never deferred with both ranks running: {state}")
            record.start()
            airflow.kill("scheduler")
            airflow.kill("triggerer")
            assert len(rank_processes()) == 2  # training goes on without any Airflow process
            time.sleep(5)
            airflow.start("triggerer")
            airflow.start("scheduler")
            runs = airflow.wait_for_runs("hvd_key_secrecy", 1, timeout=300)
            ti = airflow.api("GET", ti_path)
            xcom = airflow.api("GET", f"{ti_path}/xcomEntries/return_value")
        seconds = record.failed_after()
    assert runs[0]["state"] == "success" and ti["state"] == "success", (runs, ti)
    assert ti["try_number"] == 1  # the same try, resumed: no retry
    value = xcom["value"] if isinstance(xcom["value"], dict) else json.loads(xcom["value"])
    assert value["size"] == 2 and value["steps"] > 0, xcom
    drivers = list((tmp_path / "cluster").glob("work*/driver-*"))
    assert len(drivers) == 1, drivers  # one training: the restarted side attached to it, started none
    # The ranks' lines reached the task's log through the trigger (its log files, which the UI shows
    # with the task's): the restarted triggerer's too.
    trigger_logs = sorted(home.glob("logs/dag_id=hvd_key_secrecy/run_id=*/task_id=train/attempt=1.log.trigger.*"))
    assert len(trigger_logs) == 2, trigger_logs  # one per triggerer process
    last = trigger_logs[-1].read_text()
    assert "rank 0 did" in last and "rank 1 did" in last and f"{drivers[0].name}: FINISHED" in last
    record.observe(f"task resumed and succeeded {seconds:.0f} s after the kill; one driver ({drivers[0].name})",
                   seconds)
