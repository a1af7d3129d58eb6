"""The package as users get it (issue 13): `python -m build`, the wheel installed into a fresh
virtual environment outside the repository, and used with no environment variable set:
a user's script on local[2], a user's own DAG folder through `airflow tasks test`, functions
defined interactively in `__main__`, and the same environment packed with venv-pack and shipped
to a standalone cluster's workers with spark.archives.

The horovod wheel comes from scripts/setup.sh's cache (it is built from source there), as a
user's set-up would install it before this package.
"""

import json
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import early
import pytest
from conftest import assert_no_run_processes, readme_block, user_env
from spark_cluster import StandaloneCluster

REPO = Path(__file__).resolve().parent.parent

TRAIN = textwrap.dedent("""
    def train(scale):
        import horovod.torch as hvd
        import torch

        hvd.init()
        return hvd.allreduce(torch.tensor([float(hvd.rank() + 1)]), op=hvd.Sum).item() * scale
""")

USER_SCRIPT = textwrap.dedent("""
    import logging
    from pyspark.sql import SparkSession
    from airflow_provider_hvd import HorovodRunner

    logging.basicConfig(level=logging.INFO)
""") + TRAIN + textwrap.dedent("""
    spark = SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false").getOrCreate()
    print("RESULT", HorovodRunner(np=2).run(train, scale=10))
    spark.stop()
""")

# As typed into `python -` (a notebook cell is the same): functions only __main__ knows, one
# closing over a local variable and a lambda.
INTERACTIVE = textwrap.dedent("""
    from pyspark.sql import SparkSession
    from airflow_provider_hvd import HorovodRunner

    spark = SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false").getOrCreate()

    def make_train(offset):
        scale = lambda x: x * 10
        def train():
            import horovod.torch as hvd
            import torch
            hvd.init()
            return scale(hvd.allreduce(torch.tensor([float(hvd.rank())]), op=hvd.Sum).item() + offset)
        return train

    print("CLOSURE", HorovodRunner(np=2).run(make_train(5)))
    print("LAMBDA", HorovodRunner(np=2).run(lambda a, b: a * b, a=6, b=7))
    spark.stop()
""")

# README.md's own DAG, with the storage path of the test.
USER_DAG = readme_block("DAG").replace("file:///tmp/my-training", "file://{storage}")

# The driver of a cluster whose workers lack every package: the environment travels as an archive.
ARCHIVES_USER = textwrap.dedent("""
    import json, sys
    from pyspark.sql import SparkSession
    from airflow_provider_hvd import HorovodRunner

    def where():
        import os, sys
        import horovod.torch as hvd
        hvd.init()
        return hvd.allgather_object({"rank": hvd.rank(), "prefix": sys.prefix, "cwd": os.getcwd()})

    master, archive = sys.argv[1:3]
    spark = (SparkSession.builder.master(master)
             .config("spark.archives", archive + "#environment")
             .config("spark.pyspark.python", "./environment/bin/python")
             .config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
             .config("spark.executor.memory", "768m").config("spark.executor.cores", "1")
             .config("spark.ui.enabled", "false").getOrCreate())
    for launcher in ("gloo", "mpi"):
        out = HorovodRunner(np=2, launcher=launcher, slot_wait_timeout=120, start_timeout=300).run(where)
        print("RANKS " + json.dumps({"launcher": launcher, "ranks": out}), flush=True)
    spark.stop()
""")


def run(cmd, timeout=900, **kwargs):
    done = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=timeout, **kwargs)
    assert done.returncode == 0, f"{cmd} failed:\n{done.stdout[-3000:]}\n{done.stderr[-5000:]}"
    return done


@early.step("installed", needs=("distributions", "pyspark_wheels"))
def user_environment(built_distributions, sdist_wheels) -> dict:
    """README.md's install (make dist, done by ``distributions``; then a fresh venv and pip) into a
    folder outside the repository; that venv packed for spark.archives; then the Airflow extra added
    to it for the DAG test."""
    root = early.folder("user")
    wheel = built_distributions["wheel"]
    t0 = time.monotonic()
    env = root / "env"
    steps = readme_block("install").split("\n", 1)[1].replace("~/hvd", str(env))
    run([*early.NICE, "bash", "-euo", "pipefail", "-c", steps], cwd=built_distributions["source"], env=user_env())
    constraints = built_distributions["source"] / "dist" / "constraints.txt"
    t_install = time.monotonic()
    archive = root / "environment.tar.gz"
    # Workers take pyspark from Spark itself, so its 450 MB of jars can stay behind; level 0
    # keeps packing and unpacking at disk speed. (Not .tar: Spark 4.2 unpacks it without
    # execute permissions.)
    run([*early.NICE, Path(sys.executable).parent / "venv-pack", "-p", env, "-o", archive, "--compress-level", "0",
         "-q", "--exclude", "lib/python3.*/site-packages/pyspark/jars/*"])
    t_pack = time.monotonic()
    # uv: the same resolution from the same index, in seconds where pip took most of a minute for
    # Airflow's few hundred requirements (torch above stays pip's: this machine's CPU wheel is pip's).
    uv = [*early.NICE, Path(sys.executable).parent / "uv", "pip", "install", "-q", "-p", env / "bin" / "python",
          "-c", constraints, "--find-links", sdist_wheels]
    run([*uv, f"{wheel}[airflow]"], env=user_env())
    took = (f"install {t_install - t0:.0f} s, pack {t_pack - t_install:.0f} s "
            f"({archive.stat().st_size >> 20} MiB), airflow extra {time.monotonic() - t_pack:.0f} s")
    return {"took": took, "root": root, "python": env / "bin" / "python", "bin": env / "bin", "wheel": wheel,
            "sdist": built_distributions["sdist"], "archive": archive}


@pytest.fixture(scope="module")
def installed():
    environment = early.result("user_environment")
    print(f"the user's environment (made while earlier tests ran): {environment['took']}")
    yield environment
    shutil.rmtree(environment["root"], ignore_errors=True)  # 3 GB: not kept until the session ends


def test_the_wheel_holds_the_package_and_nothing_else(installed):
    import zipfile

    names = zipfile.ZipFile(installed["wheel"]).namelist()
    for needed in ("airflow_provider_hvd/runner/barrier/entry.py", "airflow_provider_hvd/runner/spark_app.py",
                   "airflow_provider_hvd/operators/horovod_runner.py", "airflow_provider_hvd/examples/digits.py",
                   "airflow_provider_hvd/runner/spark_log4j2.properties"):
        assert needed in names
    assert not [n for n in names if n.startswith(("tests/", "dags/", "bench/", "scripts/"))]
    import tarfile

    with tarfile.open(installed["sdist"]) as sdist:
        members = sdist.getnames()
    assert any(m.endswith("/pyproject.toml") for m in members) and any(m.endswith("/README.md") for m in members)


def test_the_readmes_script_runs_as_written(installed, tmp_path):
    script = tmp_path / "readme.py"
    script.write_text(readme_block("script"))
    done = run([installed["python"], script], cwd=tmp_path, env=user_env(), timeout=300)
    assert "RESULT 30.0" in done.stdout and "LOCAL 30.0" in done.stdout, done.stdout[-2000:] + done.stderr[-3000:]
    assert_no_run_processes()


def test_a_users_script_on_local_master_needs_no_configuration(installed, tmp_path):
    script = tmp_path / "train.py"
    script.write_text(USER_SCRIPT)
    done = run([installed["python"], script], cwd=tmp_path, env=user_env(), timeout=300)
    assert "RESULT 30.0" in done.stdout, done.stdout[-2000:] + done.stderr[-3000:]
    assert f"the barrier tasks and ranks run this driver's Python, {installed['python']}" in done.stderr
    assert_no_run_processes()


def test_functions_defined_interactively_in_main(installed, tmp_path):
    done = run([installed["python"], "-"], input=INTERACTIVE, cwd=tmp_path, env=user_env(), timeout=300)
    assert "CLOSURE 60.0" in done.stdout and "LAMBDA 42" in done.stdout, done.stdout + done.stderr[-3000:]
    dash_c = USER_SCRIPT.replace("RESULT", "DASH_C").replace("scale=10", "scale=0.5")
    done = run([installed["python"], "-c", dash_c], cwd=tmp_path, env=user_env(), timeout=300)
    assert "DASH_C 1.5" in done.stdout, done.stdout + done.stderr[-3000:]
    assert_no_run_processes()


def test_a_users_own_dag_folder_through_airflow_tasks_test(installed, tmp_path):
    dags, home, storage = tmp_path / "my_dags", tmp_path / "airflow_home", tmp_path / "storage"
    dags.mkdir()
    (dags / "my_training.py").write_text(USER_DAG.replace("{storage}", str(storage)))
    env = user_env(AIRFLOW_HOME=str(home), AIRFLOW__CORE__DAGS_FOLDER=str(dags),
                   AIRFLOW__CORE__LOAD_EXAMPLES="False")
    airflow = installed["bin"] / "airflow"
    run([airflow, "db", "migrate"], env=env, cwd=tmp_path, timeout=300)
    done = run([airflow, "tasks", "test", "my_training", "train"], env=env, cwd=tmp_path, timeout=600)
    out = done.stdout + done.stderr
    assert "Submitting the Horovod application (np=2) to Spark master local[*]" in out, out[-4000:]
    results = list(storage.rglob("my_training/*/train/try-*/result.hvd"))
    assert len(results) == 1, out[-4000:]
    assert "Rank 0 returned 30.0" in out, out[-4000:]  # what goes to XCom (tasks test keeps no XCom)
    assert_no_run_processes()


def test_workers_without_the_packages_run_ranks_from_a_packed_environment(installed, tmp_path):
    (tmp_path / "cluster").mkdir()
    cluster = StandaloneCluster(tmp_path / "cluster").start()  # its workers' python3 has no package at all
    try:
        script = tmp_path / "archives_user.py"
        script.write_text(ARCHIVES_USER)
        done = run([installed["python"], script, cluster.url, installed["archive"]], cwd=tmp_path,
                   env=user_env(), timeout=900)
    finally:
        cluster.stop()
        for unpacked in (tmp_path / "cluster").glob("work*/app-*/*/environment"):
            shutil.rmtree(unpacked, ignore_errors=True)  # each executor's copy: GBs
    runs = [json.loads(line[6:]) for line in done.stdout.splitlines() if line.startswith("RANKS ")]
    assert [r["launcher"] for r in runs] == ["gloo", "mpi"], done.stdout[-3000:] + done.stderr[-3000:]
    work = str(tmp_path / "cluster")
    for launcher_run in runs:
        ranks = sorted(launcher_run["ranks"], key=lambda r: r["rank"])
        assert [r["rank"] for r in ranks] == [0, 1]
        for r in ranks:
            # Each rank runs the copy its own executor unpacked, in that executor's directory.
            assert r["prefix"].startswith(work) and r["prefix"].endswith("/environment"), launcher_run
            assert r["prefix"] == r["cwd"] + "/environment", launcher_run
        assert ranks[0]["prefix"] != ranks[1]["prefix"], launcher_run
    assert_no_run_processes()
