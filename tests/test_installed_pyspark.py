"""The application's Python processes import pyspark from its compiled installation, not from
Spark's zip (runner/common/installed_pyspark.py, runner/barrier/worker_daemon.py): the same code
without compiling it anew in every driver and worker daemon, and never a different release."""

import json
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pyspark
from conftest import user_env

from airflow_provider_hvd.runner import spark_app

SPARK_LIB = Path(pyspark.__file__).parent / "python" / "lib"
SPARK_ZIPS = sorted(str(p) for p in SPARK_LIB.glob("*.zip"))  # pyspark.zip, py4j-*-src.zip

WHERE_FROM = textwrap.dedent("""
    import json, sys
    from airflow_provider_hvd.runner.common.installed_pyspark import prefer_installed
    dropped = prefer_installed() if sys.argv[1] == "prefer" else []
    import py4j, pyspark
    print(json.dumps({"dropped": dropped, "pyspark": pyspark.__file__, "py4j": py4j.__file__}))
""")


def where_from(pythonpath: str, prefer: bool) -> dict:
    """Where a Python started as Spark starts one (its zips first on PYTHONPATH) imports pyspark from."""
    done = subprocess.run([sys.executable, "-c", WHERE_FROM, "prefer" if prefer else "no"], capture_output=True,
                          text=True, timeout=60, env=user_env(PYTHONPATH=pythonpath))
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout)


def test_spark_zips_of_the_installed_release_give_way_to_the_installation():
    assert len(SPARK_ZIPS) == 2, SPARK_ZIPS
    spark_path = ":".join(SPARK_ZIPS)
    plain = where_from(spark_path, prefer=False)
    assert ".zip/" in plain["pyspark"] and ".zip/" in plain["py4j"], plain  # what Spark alone gives
    preferred = where_from(spark_path, prefer=True)
    assert sorted(preferred["dropped"]) == SPARK_ZIPS
    assert preferred["pyspark"] == pyspark.__file__, preferred
    assert ".zip" not in preferred["py4j"], preferred


def test_a_zip_of_another_release_is_kept(tmp_path):
    other = tmp_path / "pyspark.zip"
    with zipfile.ZipFile(other, "w") as archive:
        archive.writestr("pyspark/__init__.py", "")
        archive.writestr("pyspark/version.py", "__version__: str = '3.5.9'\n")
    got = where_from(str(other), prefer=True)
    assert got["dropped"] == [] and got["pyspark"] == str(other / "pyspark" / "__init__.py"), got


EXECUTORS = textwrap.dedent("""
    import json, sys
    from pyspark import SparkConf, SparkContext

    def where(_):
        import pyspark.worker
        yield pyspark.worker.__file__

    conf = SparkConf().setMaster("local[2]").set("spark.ui.enabled", "false")
    if sys.argv[1:]:
        conf.set("spark.python.daemon.module", sys.argv[1])
    sc = SparkContext(conf=conf)
    print(json.dumps(sc.parallelize(range(2), 2).mapPartitions(where).collect()))
    sc.stop()
""")


def worker_files(*daemon: str) -> list[str]:
    """Where each of two local[2] tasks' Python worker imported pyspark.worker from."""
    done = subprocess.run([sys.executable, "-c", EXECUTORS, *daemon], capture_output=True, text=True, timeout=180,
                          env=user_env(SPARK_LOCAL_IP="127.0.0.1", PYSPARK_PYTHON=sys.executable))
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


def test_the_applications_worker_daemon_runs_tasks_with_the_installed_pyspark():
    assert all(".zip/" in f for f in worker_files()), "Spark's own daemon imports its zip"
    installed = str(Path(pyspark.__file__).parent / "worker.py")
    assert worker_files(spark_app.WORKER_DAEMON) == [installed, installed]
