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
