"""Shared fixtures: real Spark sessions, and the check that no process of a run survives it."""

import os
import subprocess
import sys
import time

import cloudpickle
import psutil
import pytest

# Executors start their Python workers with this interpreter (the venv's), as a
# cluster configured for this provider does.
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)

import rank_functions  # noqa: E402

cloudpickle.register_pickle_by_value(rank_functions)

RANK_MARKER = "airflow_provider_hvd.runner.rank_main"


def run_processes():
    """Processes that belong to HorovodRunner runs: ranks, and mpirun/orted that start them."""
    found = []
    for proc in psutil.process_iter(["pid", "name", "cmdline"]):
        cmdline = " ".join(proc.info.get("cmdline") or [])
        if RANK_MARKER in cmdline or proc.info.get("name") in ("orted", "mpirun"):
            found.append(proc)
    return found


def rank_processes():
    return [p for p in run_processes() if p.info.get("name") not in ("orted", "mpirun")]


def assert_no_run_processes(timeout=10.0):
    deadline = time.monotonic() + timeout
    while run_processes() and time.monotonic() < deadline:
        time.sleep(0.2)
    left = [(p.pid, " ".join(p.cmdline())) for p in run_processes() if p.is_running()]
    assert not left, f"processes of the run survived it: {left}"


@pytest.fixture
def no_leftovers():
    assert_no_run_processes()
    yield
    assert_no_run_processes()


def new_session(master, app_name, **conf):
    from pyspark.sql import SparkSession

    builder = (SparkSession.builder.master(master).appName(app_name)
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false"))
    for key, value in conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


@pytest.fixture(scope="module")
def spark_local2():
    spark = new_session("local[2]", "hvd-tests-local2")
    yield spark
    spark.stop()


def python_in_venv(*args, **kwargs):
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, **kwargs)


# py4j logs at INFO from its atexit hook, after pytest has closed the captured streams.
import logging  # noqa: E402

logging.getLogger("py4j").setLevel(logging.WARNING)
