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
from waiting import wait_for
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


def assert_nothing_of_the_run_left(timeout: float) -> None:
    """No rank, orted or mpirun, and no Spark driver (its JVM wrapper or spark_app.py), within ``timeout``."""
    assert_no_run_processes(timeout=timeout)
    wait_for("the Spark driver (DriverWrapper, spark_app.py) to end", lambda: not driver_processes(), timeout,
             interval=0.2, seen=lambda: [p.info["cmdline"] for p in driver_processes()])


def driver_state(cluster, driver_id: str) -> str:
    url = f"http://127.0.0.1:{cluster.rest_port}/v1/submissions/status/{driver_id}"
    with urllib.request.urlopen(url, timeout=10) as reply:
        return json.loads(reply.read()).get("driverState", "NOT_FOUND")


def test_a_followed_driver_is_looked_at_quickly_at_first_then_every_poll_interval():
    """The operator and the trigger see a short run end within a quarter second; a long one costs the
    master one status request per poll_interval."""
    from airflow_provider_hvd.hooks.standalone_driver import poll_delay

    assert poll_delay(0.0, 1.0) == 0.25 and poll_delay(29.9, 1.0) == 0.25
    assert poll_delay(30.0, 1.0) == 1.0 and poll_delay(3600.0, 5.0) == 5.0
    assert poll_delay(0.0, 0.1) == 0.1  # a quicker interval asked for is kept


FOLLOW_SCRIPT = """
import asyncio, json, sys, time
from airflow_provider_hvd.hooks.spark_submit import HorovodSparkSubmitHook
from airflow_provider_hvd.hooks.standalone_driver import StandaloneDriverHook
from airflow_provider_hvd.runner.driver.log_shipper import LogShipper
from airflow_provider_hvd.triggers.horovod_driver import HorovodDriverTrigger

driver_id, folder = sys.argv[1], sys.argv[2]
for name, code in (("failed", 1), ("succeeded", 0)):  # each application's output and its last word
    shipper = LogShipper(f"file://{folder}/{name}", interval=3600).start()
    print(f"the {name} application's last line", file=sys.stderr)
    shipper.close(exit_code=code)


async def first_event(log_dir, timeout):
    trigger = HorovodDriverTrigger(rest_endpoint=hook.rest_endpoint, driver_id=driver_id, log_dir=log_dir)
    events = trigger.run()
    try:
        return (await asyncio.wait_for(anext(events), timeout)).payload
    except asyncio.TimeoutError:
        return None
    finally:
        await events.aclose()


hook = HorovodSparkSubmitHook(conn_id="spark_test", deploy_mode="cluster")
t0 = time.monotonic()
followed = StandaloneDriverHook(hook.rest_endpoint, driver_id, f"file://{folder}/succeeded").follow(
    hook.process_driver_output)
followed_s = time.monotonic() - t0
print(json.dumps({"followed": followed, "followed_s": followed_s,
                  "trigger_succeeded": asyncio.run(first_event(f"file://{folder}/succeeded", 30)),
                  "trigger_failed": asyncio.run(first_event(f"file://{folder}/failed", 2))}))
"""


# Stand-ins for spark-submit's standalone client (a shell script in place of its JVM, which needs a master
# that accepts a driver): what it prints, and how it takes the SIGTERM the hook sends once the driver is accepted.
SUBMISSION_CLIENTS = {
    # accepted, then 1 s of shutdown (Spark's hooks) after the SIGTERM
    "slow_exit": "trap 'kill $!; sleep 1; exit 143' TERM; echo 'INFO ClientEndpoint: Driver successfully submitted "
                 "as driver-20261206000000-0001'; sleep 60 & wait",
    # refused by the master: no driver id
    "refused": "echo 'ERROR ClientEndpoint: Driver submission failed: no worker'; exit 1",
    # accepted, then deaf to SIGTERM
    "deaf": "trap '' TERM; echo 'INFO ClientEndpoint: Driver successfully submitted as driver-20261206000000-0002'; "
            "exec sleep 60",
}

SUBMIT_SCRIPT = """
import json, sys
from airflow_provider_hvd.hooks.spark_submit import HorovodSparkSubmitHook

class StandInClient(HorovodSparkSubmitHook):
    def _build_spark_submit_command(self, application):
        return ["bash", "-c", sys.argv[1]]

seen = {}
for case, script in json.loads(sys.argv[2]).items():
    hook = StandInClient(conn_id="hvd_spark_test", deploy_mode="cluster")
    sys.argv[1] = script
    try:
        driver_id = hook.submit("app.jar")
    except Exception as exc:
        seen[case] = {"error": f"{type(exc).__name__}: {exc}", "exited": hook._submit_sp.poll()}
        continue
    exiting = hook._submit_sp.poll() is None
    hook.wait_submission_client(timeout=3)
    seen[case] = {"driver_id": driver_id, "still_exiting_on_return": exiting, "exit": hook._submit_sp.poll()}
print(json.dumps(seen))
"""


def test_a_cluster_mode_submission_returns_once_the_driver_is_accepted_and_its_client_is_waited_for(airflow):
    """spark-submit's standalone client, signalled once the master has accepted the driver, exits while the
    task goes on (its JVM's shutdown took 0.3-0.4 s of every task); ``wait_submission_client`` waits for it,
    and kills one that does not exit. A refused submission still fails at once."""
    env = {**airflow["env"], "AIRFLOW_CONN_HVD_SPARK_TEST": "spark://spark-master:7077"}
    done = subprocess.run([sys.executable, "-c", SUBMIT_SCRIPT, "", json.dumps(SUBMISSION_CLIENTS)], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-4000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["slow_exit"] == {"driver_id": "driver-20261206000000-0001", "still_exiting_on_return": True,
                                 "exit": 143}, seen
    assert seen["refused"]["error"].startswith("AirflowException: ") and seen["refused"]["exited"] == 1, seen
    assert seen["deaf"] == {"driver_id": "driver-20261206000000-0002", "still_exiting_on_return": True,
                            "exit": -signal.SIGKILL}, seen
    said = done.stdout + done.stderr
    assert "had not exited 3 s after the master accepted the driver: killing it" in said, said[-3000:]


def test_the_task_ends_on_its_drivers_own_word_that_it_succeeded_before_the_master_says_so(airflow, tmp_path):
    """A driver's application writes rank 0's result, ships the last of its output and says it succeeded
    (its last heartbeat's exit code 0: runner/driver/log_shipper.py); its JVM has still to exit and its worker
    to tell the master. The operator's follower and the trigger end on that word, with every line, without
    waiting for the master. A failure is left for the master to report. The master here is real, with no
    worker: it holds the driver SUBMITTED throughout, as it would report a driver still exiting."""
    (tmp_path / "cluster").mkdir()
    master = StandaloneCluster(tmp_path / "cluster", worker_hosts=(), rest=True).start()
    try:
        body = {"action": "CreateSubmissionRequest", "appResource": "file:/no/such.jar", "mainClass": "NoSuchMain",
                "appArgs": [], "clientSparkVersion": "4.2.0", "environmentVariables": {},
                "sparkProperties": {"spark.app.name": "hvd-held", "spark.master": master.url,
                                    "spark.submit.deployMode": "cluster"}}
        request = urllib.request.Request(f"http://127.0.0.1:{master.rest_port}/v1/submissions/create",
                                         data=json.dumps(body).encode(), method="POST",
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=30) as reply:
            driver_id = json.loads(reply.read())["submissionId"]
        env = {**airflow["env"], "AIRFLOW_CONN_SPARK_TEST": json.dumps(master.connection())}
        done = subprocess.run([sys.executable, "-c", FOLLOW_SCRIPT, driver_id, str(tmp_path)], env=env,
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr[-4000:]
        seen = json.loads(done.stdout.strip().splitlines()[-1])
        held = driver_state(master, driver_id)
    finally:
        master.stop()
    assert held == "SUBMITTED"  # the master never said the driver ended
    assert seen["followed"] == "FINISHED" and seen["followed_s"] < 5, seen
    assert "the succeeded application's last line" in done.stderr, done.stderr[-4000:]  # the hook logs its lines
    assert seen["trigger_succeeded"] == {"driver_id": driver_id, "state": "FINISHED", "next_seq": 1}, seen
    assert seen["trigger_failed"] is None, seen  # still following: the master will say FAILED


@pytest.mark.faults
def test_killing_the_task_kills_the_driver_on_the_cluster_and_every_rank(airflow, tmp_path, cluster, s3_bucket,
                                                                        fault, no_leftovers):
    record = fault("Airflow kills a training task whose Spark driver runs on the cluster (standalone cluster mode)",
                   "the driver is killed through the master; it and every rank end within 10 s")
    env = task_env(airflow, tmp_path, cluster, s3_bucket, HVD_TEST_SECONDS="600")
    proc = subprocess.Popen([AIRFLOW, "tasks", "test", "hvd_key_secrecy", "train"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        def pid_files():
            return sorted(p.name for p in tmp_path.glob("rank-*.pid"))

        wait_for("both ranks to reach training (their pid files)", lambda: len(pid_files()) == 2, 180, process=proc,
                 seen=lambda: proc.stdout.read()[-5000:] if proc.poll() is not None else pid_files())
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
    assert_nothing_of_the_run_left(timeout=10)
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
    import pyspark

    # A jar of the user's own, which the executors must still fetch.
    user_jar = next((Path(pyspark.__file__).parent / "jars").glob("minlog-*.jar"))
    env = task_env(airflow, tmp_path, cluster, s3_bucket, HVD_TEST_DEFERRABLE="1",
                   HVD_TEST_CONF=json.dumps({"spark.jars": f"file:{user_jar}"}))
    done = subprocess.run([AIRFLOW, "dags", "test", "hvd_key_secrecy"], env=env, capture_output=True, text=True,
                          timeout=600)
    out = done.stdout + done.stderr
    assert done.returncode == 0 and "state=success" in out, out[-5000:]
    assert "handing this task to the triggerer" in out and "HorovodDriverTrigger" in out, out[-5000:]
    assert "rank 0 did" in out and "rank 1 did" in out, out[-5000:]  # relayed by the trigger
    assert "Rank 0 returned {'size': 2" in out, out[-5000:]
    # spark-core's jar only carried PythonRunner to the driver (placements/standalone.py): no executor
    # fetched a copy of it (15 MB before its first task, in its work directory); the user's jar they did.
    executor_dirs = list((tmp_path / "cluster").glob("work*/app-*/*"))
    assert executor_dirs, list((tmp_path / "cluster").rglob("*"))
    for executor_dir in executor_dirs:
        assert sorted(jar.name for jar in executor_dir.glob("*.jar")) == [user_jar.name], executor_dir


@pytest.fixture(scope="module")
def deployment(tmp_path_factory, s3_server):
    """Airflow as deployed (api-server, scheduler with LocalExecutor, dag-processor, triggerer on
    PostgreSQL) with tests/dags, set for cluster mode on a standalone cluster of its own with storage in
    one bucket: one for the module's fault tests, each of which triggers its own runs, starts from no
    rank marker and no release file, and leaves no run going (``no_leftovers``)."""
    import fsspec
    from airflow_services import AirflowServices, cli, service_env
    from postgres_server import PostgresServer

    root = tmp_path_factory.mktemp("deployment")
    (root / "cluster").mkdir()
    (root / "markers").mkdir()
    with pytest.MonkeyPatch.context() as env_of_this_process:
        for name, value in {"AWS_ENDPOINT_URL": s3_server, "AWS_ACCESS_KEY_ID": "testing",
                            "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}.items():
            env_of_this_process.setenv(name, value)
        bucket = f"hvd-{time.monotonic_ns()}"
        fsspec.filesystem("s3", skip_instance_cache=True).mkdir(bucket)
        cluster = StandaloneCluster(root / "cluster", cores_per_worker=2, memory="2g", rest=True).start()
        try:
            knobs = {k: v for k, v in task_env({"env": {}}, root / "markers", cluster, bucket).items()
                     if k != "AIRFLOW__CORE__DAGS_FOLDER"}
            # hvd_key_secrecy defers; hvd_reattach never does (its DAG says so).
            knobs.update(HVD_TEST_DEFERRABLE="1", HVD_TEST_SECONDS="300", HVD_TEST_RELEASE=str(root / "release"))
            with PostgresServer() as postgres:
                env = service_env(root / "airflow", REPO / "tests" / "dags",
                                  AIRFLOW__DATABASE__SQL_ALCHEMY_CONN=postgres.url, **knobs)
                cli(env, "db", "migrate")
                cli(env, "dags", "reserialize")
                with AirflowServices(env, root / "service-logs") as airflow:
                    yield Deployment(airflow, cluster, root)
        finally:
            cluster.stop()


class Deployment:
    def __init__(self, airflow, cluster: StandaloneCluster, root: Path):
        self.airflow, self.cluster = airflow, cluster
        self.markers, self.release, self.logs = root / "markers", root / "release", root / "airflow" / "logs"
        self.drivers_before: set[Path] = set()

    def fresh(self) -> "Deployment":
        """Ready for a test's training: no rank marker, no release file; the drivers so far remembered."""
        for marker in self.markers.glob("rank-*.pid"):
            marker.unlink()
        self.release.unlink(missing_ok=True)
        self.drivers_before = set(self.cluster.workdir.glob("work*/driver-*"))
        return self

    def new_drivers(self) -> list[Path]:
        """The drivers the cluster started since ``fresh``."""
        return sorted(set(self.cluster.workdir.glob("work*/driver-*")) - self.drivers_before)


def trigger_and_wait(airflow, dag_id: str, markers, ti_state: str) -> str:
    """Trigger ``dag_id``; return its training task's API path once that task is ``ti_state`` with both
    ranks training."""
    airflow.api("PATCH", f"/dags/{dag_id}", {"is_paused": False})
    run_id = airflow.api("POST", f"/dags/{dag_id}/dagRuns", {"logical_date": None})["dag_run_id"]
    ti_path = f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances/train"
    deadline = time.monotonic() + 240
    state = None
    while time.monotonic() < deadline:
        state = airflow.api("GET", ti_path)["state"]
        if state == ti_state and len(list(markers.glob("rank-*.pid"))) == 2:
            return ti_path
        assert state not in ("failed", "success", "up_for_retry"), (state, airflow.log("scheduler")[-3000:])
        time.sleep(1)
    raise AssertionError(f"{dag_id}: never {ti_state} with both ranks running: {state}")


def wait_for_log(logs: Path, pattern: str, text: str, count: int = 1, timeout: float = 240) -> str:
    """The newest of the ``count`` or more Airflow log files ``pattern`` names under ``logs`` once it
    holds ``text``."""
    deadline = time.monotonic() + timeout
    found: list[Path] = []
    while time.monotonic() < deadline:
        found = sorted(logs.glob(pattern), key=lambda f: f.stat().st_mtime)
        if len(found) >= count and text in found[-1].read_text(errors="replace"):
            return found[-1].read_text(errors="replace")
        time.sleep(0.5)
    raise AssertionError(f"no {pattern} ({count} expected, {len(found)} there) said {text!r} within {timeout} s: "
                         f"{found[-1].read_text(errors='replace')[-3000:] if found else ''}")


def task_processes() -> list[psutil.Process]:
    """The processes that run a task: Airflow's task runner titles itself "airflow worker -- <ti id>";
    the LocalExecutor's workers, which supervise them, "airflow worker -- LocalExecutor: ..."."""
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        title = " ".join(proc.info["cmdline"] or [])
        if title.startswith("airflow worker -- ") and "LocalExecutor" not in title:
            found.append(proc)
    return found


@pytest.mark.faults
def test_a_retry_attaches_to_the_driver_its_earlier_try_left_running(deployment, fault, no_leftovers):
    """The Airflow worker running a cluster-mode task dies mid-training (SIGKILL: no on_kill), while the
    driver trains on in the cluster. The task's retry finds try 1's driver still running and follows it
    to its end instead of submitting a second training; rank 0's value comes back in try 2."""
    record = fault("The Airflow worker running a training task dies (SIGKILL) while its driver runs on the cluster",
                   "the retry attaches to the running driver: one training, rank 0's value in try 2")
    deployed = deployment.fresh()
    airflow, release = deployed.airflow, deployed.release  # the ranks train until it exists (300 s at most)
    ti_path = trigger_and_wait(airflow, "hvd_reattach", deployed.markers, "running")
    victims = task_processes()
    assert len(victims) == 1, [p.info["cmdline"] for p in victims]
    record.start()
    victims[0].kill()
    assert len(rank_processes()) == 2  # training goes on without its task
    # Try 2 must find the driver still training; once it has, the training may end.
    wait_for_log(deployed.logs / "dag_id=hvd_reattach", "run_id=*/task_id=train/attempt=2.log",
                 "is still RUNNING: attaching to it")
    assert len(rank_processes()) == 2
    release.touch()
    runs = airflow.wait_for_runs("hvd_reattach", 1, timeout=300)
    ti = airflow.api("GET", ti_path)
    xcom = airflow.api("GET", f"{ti_path}/xcomEntries/return_value")
    seconds = record.failed_after()
    assert runs[0]["state"] == "success" and ti["state"] == "success", (runs, ti)
    assert ti["try_number"] == 2, ti  # try 1 failed with its worker; try 2 attached
    value = xcom["value"] if isinstance(xcom["value"], dict) else json.loads(xcom["value"])
    assert value["size"] == 2 and value["steps"] > 0, xcom
    drivers = deployed.new_drivers()
    assert len(drivers) == 1, drivers  # one training
    logs = deployed.logs / "dag_id=hvd_reattach"
    try_2 = next(logs.glob("run_id=*/task_id=train/attempt=2.log")).read_text()
    assert f"Spark driver {drivers[0].name} of try 1 is still RUNNING: attaching to it" in try_2, try_2[-4000:]
    assert "Submitting the Horovod application" not in try_2
    assert "rank 0 did" in try_2 and f"{drivers[0].name}: FINISHED" in try_2, try_2[-4000:]
    record.observe(f"try 2 attached to {drivers[0].name} and succeeded {seconds:.0f} s after the kill", seconds)


@pytest.mark.faults
def test_a_deferred_training_survives_the_airflow_side_being_killed_and_ends_when_marked_failed(
        deployment, fault, no_leftovers):
    """Airflow as deployed (scheduler with LocalExecutor, triggerer, ... on PostgreSQL): the training task
    defers while its driver runs on the cluster; the scheduler (with its executor's workers) and the
    triggerer are SIGKILLed mid-training and started again; the task completes with rank 0's value and
    no second training starts. Then a second run is marked failed while deferred: its driver is killed."""
    record = fault("The scheduler (with its task workers) and the triggerer die while a deferred training runs",
                   "once restarted, the trigger follows the same driver; the task completes, no second training")
    deployed = deployment.fresh()
    airflow, release = deployed.airflow, deployed.release  # the ranks train until it exists (300 s at most)
    ti_path = trigger_and_wait(airflow, "hvd_key_secrecy", deployed.markers, "deferred")
    record.start()
    airflow.kill("scheduler")
    airflow.kill("triggerer")
    assert len(rank_processes()) == 2  # training goes on without any Airflow process
    time.sleep(5)
    airflow.start("triggerer")
    airflow.start("scheduler")
    # The restarted triggerer must pick the same driver up while it trains; then the training may end.
    wait_for_log(deployed.logs / "dag_id=hvd_key_secrecy", "run_id=*/task_id=train/attempt=1.log.trigger.*",
                 ": RUNNING", count=2)
    assert len(rank_processes()) == 2
    release.touch()
    runs = airflow.wait_for_runs("hvd_key_secrecy", 1, timeout=300)
    ti = airflow.api("GET", ti_path)
    xcom = airflow.api("GET", f"{ti_path}/xcomEntries/return_value")
    seconds = record.failed_after()
    drivers = deployed.new_drivers()

    # A second run, marked failed by a user while deferred: the trigger's on_kill kills its driver.
    killed = fault("A user marks a deferred training task failed (REST API) while its driver runs",
                   "the trigger kills the driver through the master: no rank, orted or driver within 10 s")
    for marker in deployed.markers.glob("rank-*.pid"):
        marker.unlink()
    release.unlink()  # this one trains until it is killed
    second = trigger_and_wait(airflow, "hvd_key_secrecy", deployed.markers, "deferred")
    second_driver = airflow.api("GET", f"{second}/xcomEntries/spark_driver_id")["value"]
    killed.start()
    airflow.api("PATCH", second, {"new_state": "failed"})
    assert_nothing_of_the_run_left(timeout=10)
    killed_after = killed.failed_after()
    assert driver_state(deployed.cluster, second_driver) == "KILLED"
    killed.observe(f"driver {second_driver} KILLED; no rank, orted or driver process left", killed_after)
    assert runs[0]["state"] == "success" and ti["state"] == "success", (runs, ti)
    assert ti["try_number"] == 1  # the same try, resumed: no retry
    value = xcom["value"] if isinstance(xcom["value"], dict) else json.loads(xcom["value"])
    assert value["size"] == 2 and value["steps"] > 0, xcom
    assert len(drivers) == 1, drivers  # one training: the restarted side attached to it, started none
    # The ranks' lines reached the task's log through the trigger (its log files, which the UI shows
    # with the task's): the restarted triggerer's too.
    run_id = ti_path.split("/")[4]
    trigger_logs = sorted(deployed.logs.glob(f"dag_id=hvd_key_secrecy/run_id={run_id}/task_id=train/"
                                             "attempt=1.log.trigger.*"))
    assert len(trigger_logs) == 2, trigger_logs  # one per triggerer process
    last = trigger_logs[-1].read_text()
    assert "rank 0 did" in last and "rank 1 did" in last and f"{drivers[0].name}: FINISHED" in last
    record.observe(f"task resumed and succeeded {seconds:.0f} s after the kill; one driver ({drivers[0].name})",
                   seconds)


def test_a_retry_refuses_to_start_beside_a_forgotten_driver_that_still_beats(tmp_path, s3_bucket, monkeypatch):
    """Try 1's submission id is unknown to the master (it restarted without recovery), yet that driver's
    heartbeat in storage is fresh: it still trains somewhere. Try 2 fails naming it and what to do, before
    it writes or submits anything (a second training would race it for the same checkpoints)."""
    import fsspec
    from airflow.sdk import ObjectStoragePath

    from airflow_provider_hvd.operators.horovod_runner import HorovodRunnerOperator
    from airflow_provider_hvd.placements.earlier_driver import DriverRecord
    from airflow_provider_hvd.placements.try_files import TryFiles
    from airflow_provider_hvd.runner.wire.driver_log import Heartbeat, heartbeat_url
    from airflow_provider_hvd.version_compat import AirflowException

    (tmp_path / "cluster").mkdir()
    master = StandaloneCluster(tmp_path / "cluster", worker_hosts=(), rest=True).start()  # nothing runs there
    try:
        for name, value in {**cluster_mode_environment(s3_bucket, "ab" * 32),
                            "AIRFLOW_CONN_SPARK_TEST": json.dumps(master.connection())}.items():
            monkeypatch.setenv(name, value)
        try_1 = f"s3://{s3_bucket}/runs/d/manual__1/train/try-1"
        record = TryFiles(ObjectStoragePath(f"s3://{s3_bucket}/runs/d/manual__1/train"), 1).driver_record
        forgotten = "driver-20261204000000-0007"
        fs = fsspec.filesystem("s3")
        fs.pipe(record.path, DriverRecord(
            driver_id=forgotten, rest_endpoint=f"http://127.0.0.1:{master.rest_port}", try_number=1,
            log_dir=f"{try_1}/driver-log", submitted_at=time.time() - 600).to_json().encode())
        fs.pipe(heartbeat_url(f"{try_1}/driver-log").removeprefix("s3://"),
                Heartbeat(time=time.time() - 3, chunks=40).to_json())

        class TryTwo:  # the task instance as the operator sees it: try 2 of task "train"
            dag_id, task_id, try_number = "d", "train", 2

            def xcom_push(self, key, value):
                raise AssertionError(f"pushed {key} before refusing")

        op = HorovodRunnerOperator(task_id="train", python_callable=print, np=2, spark_conn_id="spark_test",
                                   deploy_mode="cluster")
        with pytest.raises(AirflowException) as raised:
            op.execute({"ti": TryTwo(), "run_id": "manual__1"})
    finally:
        master.stop()
    message = str(raised.value)
    assert f"Spark driver {forgotten} of try 1 is unknown to the Spark master" in message, message
    assert "heartbeat" in message and "still runs" in message and "Kill that driver" in message, message
    assert not ObjectStoragePath(f"s3://{s3_bucket}/runs/d/manual__1/train/try-2").exists()
