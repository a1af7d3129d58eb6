"""The private APIs of pyspark, horovod and the apache-spark provider that we rely on still do what we
rely on. Each is used in one place only (driver/pyspark_internals.py, rank/stall.py,
hooks/horovod.py); when an upgrade changes one, the test here fails naming it, before users'
runs would."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import rank_functions as rf


def test_pyspark_fixes_an_rdds_python_when_its_function_is_wrapped(spark_local2):
    """SparkContext.pythonExec + RDD._jrdd: the executable read at wrapping time is the one the
    tasks start, whatever pythonExec is later; the user's own jobs keep theirs."""
    from airflow_provider_hvd.runner.driver import pyspark_internals

    sc = spark_local2.sparkContext
    assert hasattr(sc, "pythonExec"), "pyspark's SparkContext.pythonExec is gone: see driver/pyspark_internals.py"
    before = sc.pythonExec
    ours = sc.parallelize(range(2), 2).mapPartitions(lambda rows: [1])
    with pyspark_internals.python_exec(sc, "/nonexistent/hvd-python"):
        pyspark_internals.wrap_python_function(ours)
    assert sc.pythonExec == before
    theirs = sc.parallelize(range(2), 2).mapPartitions(lambda rows: [2])
    assert theirs.collect() == [2, 2]  # unaffected
    with pytest.raises(Exception, match="/nonexistent/hvd-python"):
        ours.collect()  # fixed at wrapping: RDD._jrdd no longer reads pythonExec at collect time


def test_spark_counts_free_task_slots_through_its_jvm(spark_local2):
    """SparkContext._jsc.sc().maxNumConcurrentTasks(defaultResourceProfile())."""
    from airflow_provider_hvd.runner.driver import pyspark_internals

    assert pyspark_internals.max_concurrent_tasks(spark_local2.sparkContext) == 2


def test_the_jvm_half_of_sparkcontext_stop_ends_the_application():
    """SparkContext._jsc.stop(): what runner/spark_app.py calls instead of SparkContext.stop() (which
    then waits for pyspark's accumulator server) stops the JVM's context: a new one can start."""
    script = """
from pyspark import SparkConf, SparkContext
from airflow_provider_hvd.runner.driver import pyspark_internals
conf = SparkConf().setMaster("local[1]").set("spark.ui.enabled", "false")
sc = SparkContext.getOrCreate(conf)
jvm_context = sc._jsc.sc()
pyspark_internals.stop_jvm_context(sc)
print("STOPPED", jvm_context.isStopped())
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert "STOPPED True" in done.stdout, (
        f"SparkContext._jsc.stop() no longer stops the JVM's context (driver/pyspark_internals.py):\n"
        f"{done.stdout[-2000:]}{done.stderr[-2000:]}")


def test_a_conf_made_through_the_gateway_holds_spark_submits_properties(tmp_path):
    """SparkContext._ensure_initialized(): after it, SparkConf() holds what spark-submit was given (a bare
    SparkConf() knows nothing, and an edit to it replaces the submitted value: runner/spark_app.py)."""
    import pyspark

    script = tmp_path / "probe.py"
    script.write_text("from airflow_provider_hvd.runner.driver import pyspark_internals\n"
                      "conf = pyspark_internals.submitted_conf()\n"
                      "print('PROBE', conf.get('spark.hvd.probe'), conf.get('spark.jars'))\n")
    spark_submit = Path(pyspark.__file__).parent / "bin" / "spark-submit"
    done = subprocess.run([str(spark_submit), "--master", "local[1]", "--conf", "spark.hvd.probe=submitted",
                           "--conf", "spark.jars=file:/opt/user.jar", str(script)],
                          env={**os.environ, "PYSPARK_PYTHON": sys.executable}, capture_output=True, text=True,
                          timeout=120)
    assert "PROBE submitted file:/opt/user.jar" in done.stdout, (
        "SparkContext._ensure_initialized() no longer gives SparkConf() spark-submit's properties "
        f"(driver/pyspark_internals.py):\n{done.stdout[-2000:]}{done.stderr[-2000:]}")


def test_horovod_torch_keeps_pending_collectives_in_its_handle_map():
    """horovod.torch.mpi_ops._handle_map, which the stall watch reads (rank/stall.py)."""
    from airflow_provider_hvd import HorovodRunner

    seen = HorovodRunner(np=-1, launcher="gloo").run(rf.handle_map_while_pending)
    assert seen == {"is_dict": True, "pending_listed": True, "done_removed": True}, (
        "horovod.torch.mpi_ops._handle_map no longer lists pending collectives: the stall watch "
        f"(rank/stall.py) cannot see them. Saw {seen}")


def test_spark_submit_hook_resolves_its_master_through_resolve_connection(airflow):
    """SparkSubmitHook._resolve_connection() -> _connection["master"]: where HorovodSparkSubmitHook
    refuses a connection that does not exist and puts local[*] for conn_id=None (hooks/spark_submit.py)."""
    script = """
import json
from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook
from airflow_provider_hvd.hooks.spark_submit import HorovodSparkSubmitHook
assert "_resolve_connection" in vars(SparkSubmitHook), "SparkSubmitHook._resolve_connection is gone"
import inspect
assert "self._process_spark_submit_log(" in inspect.getsource(SparkSubmitHook.submit), (
    "SparkSubmitHook.submit no longer reads spark-submit's output through _process_spark_submit_log: "
    "HorovodSparkSubmitHook cannot see the application's announcement (the Spark UI link)")
plain = SparkSubmitHook(conn_id="hvd_no_such_connection")
try:
    HorovodSparkSubmitHook(conn_id="hvd_no_such_connection")
    missing = None
except Exception as exc:
    missing = f"{type(exc).__name__}: {exc}"
local = HorovodSparkSubmitHook(conn_id=None)
named = HorovodSparkSubmitHook(conn_id="hvd_spark_test")
# One hook per task: the command's fields are set from the placement's plan after __init__ resolved the connection.
from airflow_provider_hvd.hooks.spark_submit import SparkLaunch
launch = SparkLaunch(application="app.jar", application_args=["--np", "2"], conf={"spark.x": "1"}, env={},
                     name="hvd-name", java_class="org.Main", files=["/k#hvd-signing-key"])
command = named._build_spark_submit_command(named.use(launch))
# Standalone cluster mode: the provider decides to track the driver, keeps the id it parsed from
# spark-submit's output in _driver_id, and builds the master's REST endpoint.
assert "self._submit_sp = subprocess.Popen(" in inspect.getsource(SparkSubmitHook.submit), (
    "SparkSubmitHook.submit no longer keeps spark-submit's process in _submit_sp: HorovodSparkSubmitHook "
    "cannot end spark-submit's client once a standalone cluster-mode driver is accepted (5 s per task)")
cluster = HorovodSparkSubmitHook(conn_id="hvd_spark_test", deploy_mode="cluster")
import subprocess
cluster._submit_sp = subprocess.Popen(["sleep", "60"])  # stands for spark-submit's client, which sleeps 5 s
cluster._process_spark_submit_log(iter(["INFO ClientEndpoint: Driver successfully submitted as driver-20261204-0007"]))
client_ended = cluster._submit_sp.wait(10)
print(json.dumps({"command": command, "plain": plain._connection["master"], "missing": missing, "local": local.master,
                  "local_deploy": local._connection["deploy_mode"], "named": named.master,
                  "tracks": cluster._should_track_driver_status, "driver_id": cluster.driver_id,
                  "rest": cluster.rest_endpoint, "client_ended": client_ended}))
"""
    env = {**airflow["env"], "AIRFLOW_CONN_HVD_SPARK_TEST": "spark://spark-master:7077"}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    command = seen["command"]
    assert command[-3:] == ["app.jar", "--np", "2"] and "spark.x=1" in command, (
        "SparkSubmitHook no longer builds its command from _conf, _files, _java_class, _name and "
        f"_application_args, which HorovodSparkSubmitHook.use sets: {command}")
    for flag, value in (("--files", "/k#hvd-signing-key"), ("--class", "org.Main"), ("--name", "hvd-name")):
        assert command[command.index(flag) + 1] == value, (flag, command)
    assert seen["plain"] == "yarn"  # the provider's own silent fallback, which ours refuses
    assert seen["missing"].startswith("AirflowNotFoundException: Spark connection 'hvd_no_such_connection' "
                                      "does not exist") and "spark_conn_id=None" in seen["missing"]
    assert seen["local"] == "local[*]" and seen["local_deploy"] == "client"
    assert seen["named"] == "spark://spark-master:7077"
    assert seen["tracks"] is True and seen["driver_id"] == "driver-20261204-0007", (
        "SparkSubmitHook no longer tracks a standalone cluster-mode driver through _should_track_driver_status "
        "and _driver_id: HorovodSparkSubmitHook.driver_id and on_kill rely on them")
    assert seen["rest"] == "http://spark-master:6066"
    assert seen["client_ended"] == -15  # SIGTERM once the master accepted the driver
