"""The signing key lets whoever holds it run code on the cluster: it must not leak while a run works.

Each test runs a real training (`airflow dags test`, the horovod connection given as an
AIRFLOW_CONN_ variable with a known key, as many deployments do) and, while it runs, reads every
process's command line and environment; then searches the task log, spark-submit's output, the
Spark driver's and executors' logs, Spark's event log and the Spark UI's environment page (read
during the run through its REST API) for the key.
"""

import json
import os
import re
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import psutil
import pytest
from conftest import LOCAL_SPARK_CONNECTION
from spark_cluster import StandaloneCluster

REPO = Path(__file__).resolve().parent.parent
AIRFLOW = str(Path(sys.executable).parent / "airflow")
RANK_MODULE = "airflow_provider_hvd.runner.rank.main"
DRIVER_WRAPPER = "org.apache.spark.deploy.worker.DriverWrapper"
# spark-submit, as it runs: its shell script, the helpers that script runs to find SPARK_HOME (pyspark's
# find_spark_home.py: seen once, for the few milliseconds it lives), its launcher and its JVM.
SUBMITTER = ("bin/spark-submit", "bin/find-spark-home", "find_spark_home.py", "org.apache.spark.launcher.Main",
             "org.apache.spark.deploy.SparkSubmit")
# Python's platform.architecture() runs `file -b <python>` with its caller's environment; croniter calls it
# when Airflow imports it, so `airflow dags test` (which got the connection, key and all, from this test)
# starts one, for milliseconds (seen once in a clean-clone run). Its parent's environment is read on its own.
PLATFORM_FILE = re.compile(r"^file -b \S*python[\d.]*$")
# Between fork and exec, a child of `airflow dags test` (spark-submit, being started) still shows its
# parent's command line and environment: it is the exempt process's image, read on its own once it execs.


class ProcessWatch(threading.Thread):
    """Reads every process's command line and environment until stopped; remembers where the key was."""

    def __init__(self, key_hex: str, exempt_pid: int, cluster_driver: bool = False):
        super().__init__(daemon=True)
        self.key_hex = key_hex
        self.exempt_pid = exempt_pid  # `airflow dags test` itself: it got the connection from us
        try:
            self.exempt_cmdline = " ".join(psutil.Process(exempt_pid).cmdline())
        except psutil.Error:
            self.exempt_cmdline = None
        # Standalone cluster mode: the key reaches the driver's own environment (the worker's
        # DriverWrapper JVM and its Python child) and must reach no other process.
        self.cluster_driver = cluster_driver
        self.driver_environments: set[str] = set()
        self.leaks: set[str] = set()
        self.rank_environments = 0  # proof that the ranks were read while they ran
        self.key_file_named = False  # proof that the driver's environment was read
        self.stopped = threading.Event()

    def run(self) -> None:
        while not self.stopped.is_set():
            for proc in psutil.process_iter():
                if proc.pid in (self.exempt_pid, os.getpid()):
                    continue
                try:
                    cmdline = " ".join(proc.cmdline())
                    environ = proc.environ()
                except (psutil.Error, OSError):
                    continue
                if self.key_hex in cmdline.lower():
                    self.leaks.add(f"command line of {proc.pid}: {cmdline[:200]}")
                unexeced_fork = cmdline == self.exempt_cmdline
                if (PLATFORM_FILE.match(cmdline) or unexeced_fork) and self._parent_is_exempt(proc):
                    continue
                # The driver JVM's environment is inherited by what it starts: the Python driver and
                # Hadoop's helpers (chmod), as Spark's own _SPARK_AUTH_SECRET is. Nothing further down.
                # spark-submit (bin/spark-submit, its launcher and its JVM, on the Airflow side for the few
                # seconds of the submission) hands its environment to the cluster: the key is in it.
                is_driver = self.cluster_driver and (DRIVER_WRAPPER in cmdline or self._parent_is_driver(proc)
                                                     or any(name in cmdline for name in SUBMITTER))
                for name, value in environ.items():
                    if self.key_hex in value.lower():
                        if is_driver and name == "HVD_SIGNING_KEY":
                            self.driver_environments.add(
                                DRIVER_WRAPPER if DRIVER_WRAPPER in cmdline else "python" if "spark_app.py" in cmdline
                                else "spark-submit" if any(name in cmdline for name in SUBMITTER) else "helper")
                        else:
                            self.leaks.add(f"environment of {proc.pid} ({cmdline[:120]}): {name}")
                if RANK_MODULE in cmdline:
                    self.rank_environments += 1
                if "HVD_SIGNING_KEY_FILE" in environ:
                    self.key_file_named = True
            time.sleep(0.2)


    def _parent_is_exempt(self, proc) -> bool:
        try:
            return proc.ppid() == self.exempt_pid
        except (psutil.Error, OSError):
            return False

    @staticmethod
    def _parent_is_driver(proc) -> bool:
        try:
            parent = proc.parent()
            return parent is not None and DRIVER_WRAPPER in " ".join(parent.cmdline())
        except (psutil.Error, OSError):
            return False


def spark_ui_environment(output: list[str], proc: subprocess.Popen, deadline: float) -> str:
    """The Spark UI's environment page of the running application, as its REST API serves it."""
    while time.monotonic() < deadline and proc.poll() is None:
        found = re.search(r"its UI: (http://[\w.:-]+)", "".join(output))
        if found:
            ui = found.group(1)
            try:
                apps = json.load(urllib.request.urlopen(f"{ui}/api/v1/applications", timeout=10))
            except OSError as exc:
                raise AssertionError(f"the Spark UI at {ui} did not answer ({exc}):\n" + "".join(output)[-5000:])
            with urllib.request.urlopen(f"{ui}/api/v1/applications/{apps[0]['id']}/environment", timeout=10) as r:
                return r.read().decode()
        time.sleep(0.2)
    raise AssertionError("the Spark UI's address never reached the task log:\n" + "".join(output)[-3000:])


def files_containing(folder: Path, needle: str) -> list[str]:
    hits = []
    for path in folder.rglob("*"):
        if path.is_file() and needle in path.read_bytes().decode("latin-1").lower():
            hits.append(str(path))
    return hits


@pytest.mark.parametrize("where", ["local", "standalone", "standalone-cluster"])
def test_the_signing_key_is_in_no_command_line_environment_log_event_log_or_spark_ui(airflow, tmp_path, where,
                                                                                      no_leftovers, request):
    from airflow_provider_hvd.runner.wire import payload

    key_hex = payload.new_secret().hex()
    markers, events = tmp_path / "markers", tmp_path / "events"
    markers.mkdir()
    events.mkdir()
    env = {**airflow["env"], "AIRFLOW__CORE__DAGS_FOLDER": str(REPO / "tests" / "dags"),
           "AIRFLOW_CONN_HOROVOD_DEFAULT": json.dumps({"conn_type": "horovod", "password": key_hex}),
           "HVD_TEST_MARKERS": str(markers), "HVD_TEST_EVENT_LOG": f"file://{events}",
           "HVD_TEST_SPARK_CONN": "spark_test", "SPARK_LOCAL_IP": "127.0.0.1",
           # The Airflow worker's spark-submit (pyspark's) and the executors' Python: this environment's.
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}", "PYSPARK_PYTHON": sys.executable}
    cluster = None
    if where == "standalone":
        (tmp_path / "cluster").mkdir()
        cluster = StandaloneCluster(tmp_path / "cluster").start()
        env["AIRFLOW_CONN_SPARK_TEST"] = json.dumps({"conn_type": "spark", "host": cluster.url})
    elif where == "standalone-cluster":
        # The driver on a worker (which takes one of its cores), storage every host reaches: S3.
        env.update(cluster_mode_environment(request.getfixturevalue("s3_bucket"), key_hex))
        (tmp_path / "cluster").mkdir()
        # The driver takes a core and 1 GiB of its worker: room for an executor beside it.
        cluster = StandaloneCluster(tmp_path / "cluster", cores_per_worker=2, memory="2g", rest=True).start()
        env["AIRFLOW_CONN_SPARK_TEST"] = json.dumps(cluster.connection())
    else:
        env["AIRFLOW_CONN_SPARK_TEST"] = LOCAL_SPARK_CONNECTION
    try:
        proc = subprocess.Popen([AIRFLOW, "dags", "test", "hvd_key_secrecy"], env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)
        output: list[str] = []
        reader = threading.Thread(target=lambda: output.extend(proc.stdout), daemon=True)
        reader.start()
        watch = ProcessWatch(key_hex, exempt_pid=proc.pid, cluster_driver=where == "standalone-cluster")
        watch.start()
        try:
            ui_environment = spark_ui_environment(output, proc, time.monotonic() + 300)
            rc = proc.wait(timeout=600)
        finally:
            watch.stopped.set()
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            reader.join(10)
            watch.join(10)
        log = "".join(output)
        assert rc == 0 and "state=success" in log, log[-5000:]
        assert "rank 0 did" in log and "rank 1 did" in log  # the ranks' own lines reached the task log
    finally:
        if cluster is not None:
            cluster.stop()

    assert not watch.leaks, sorted(watch.leaks)
    # Read while it ran: the ranks (environment included) and the driver (where the key went).
    assert watch.rank_environments > 0
    if where == "standalone-cluster":
        assert {DRIVER_WRAPPER, "python"} <= watch.driver_environments, watch.driver_environments
        # The driver ran on a worker (its stdout there), and its output reached the task log through S3.
        driver_out = [p.read_text() for p in (tmp_path / "cluster").glob("work*/driver-*/stdout")]
        assert len(driver_out) == 1 and "rank 0 did" in driver_out[0], driver_out
        assert re.search(r"Following Spark driver driver-[\d-]+", log) and "Spark driver driver-" in log
    else:
        assert watch.key_file_named
    # The task log, with spark-submit's output and the Spark driver's log in it (client mode).
    assert key_hex not in log.lower()
    assert '"spark.app.name"' in ui_environment or "spark.app.name" in ui_environment
    assert key_hex not in ui_environment.lower()
    # Spark 4 writes a folder of rolling event files per application.
    assert files_containing(events, "sparklistenerenvironmentupdate"), list(events.rglob("*"))
    assert files_containing(events, key_hex) == []
    assert files_containing(airflow["home"], key_hex) == []  # Airflow's task log files, if any
    if cluster is not None:
        # The master's and workers' logs, and every executor's stdout/stderr under the work dirs.
        executor_logs = list((tmp_path / "cluster").glob("work*/app-*/*/stderr"))
        assert len(executor_logs) >= 2
        assert files_containing(tmp_path / "cluster", key_hex) == []
    # The one-time key file is gone, folder and all.
    assert not [p for p in Path(os.environ.get("TMPDIR", "/tmp")).glob("hvd-key-*")]


def cluster_mode_environment(bucket: str, key_hex: str) -> dict[str, str]:
    """`airflow dags test`'s environment for cluster deploy mode: storage in the S3 bucket (moto's
    server, the stand-in for a cloud bucket), reached by Airflow through aws_default as deployments do
    and by the driver and ranks through the standard AWS variables."""
    endpoint = os.environ["AWS_ENDPOINT_URL"]  # set by the s3_bucket fixture
    aws = {name: os.environ[name] for name in ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY",
                                               "AWS_DEFAULT_REGION")}
    # spark-submit's environment travels to the driver (Spark's standalone client sends it): its
    # loopback address, bound and advertised alike, is where the driver lives on these loopback hosts.
    return {**aws, "HVD_TEST_DEPLOY_MODE": "cluster", "SPARK_LOCAL_HOSTNAME": "127.0.0.1",
            "AIRFLOW_CONN_HOROVOD_DEFAULT": json.dumps({"conn_type": "horovod", "password": key_hex,
                                                        "extra": {"storage_path": f"s3://{bucket}/runs"}}),
            "AIRFLOW_CONN_AWS_DEFAULT": json.dumps({"conn_type": "aws", "login": "testing", "password": "testing",
                                                    "extra": {"endpoint_url": endpoint,
                                                              "region_name": "us-east-1"}})}


def test_every_key_the_hook_hands_out_is_masked_in_airflow_logs(monkeypatch):
    """A line that happens to carry the key (a library echoing its environment) shows *** instead."""
    from airflow.sdk._shared.secrets_masker import redact  # what the task's log handler applies

    from airflow_provider_hvd.hooks.horovod import HorovodHook

    monkeypatch.delenv("AIRFLOW_CONN_HOROVOD_DEFAULT", raising=False)
    fresh = HorovodHook().signing_key()  # no connection: a key made for this run
    assert redact(f"key={fresh.hex()}") == "key=***"
