"""The Spark workers' Python (issue 13): chosen without configuration on local masters, and when
it cannot run the ranks, a WorkerEnvironmentError in seconds naming the module, host and
executable, instead of Spark's bare "barrier stage failed".

The bad workers are real: an empty virtual environment, one with this package but no horovod,
a module only the driver has, PyPy 3.9 (a real Python older than 3.11, Debian's pypy3, installed
by scripts/setup.sh with the test extras), and an executable that does not exist.
"""

import json
import os
import shutil
import subprocess
import sys
import textwrap
import venv
from pathlib import Path

import cloudpickle
import pytest
from conftest import assert_no_run_processes, user_env

from airflow_provider_hvd.runner import spark_app
from airflow_provider_hvd.runner.driver import dependencies
from airflow_provider_hvd.runner.driver.cluster import worker_python

REPO = Path(__file__).resolve().parent.parent


def test_local_master_runs_the_drivers_python_with_nothing_configured(spark_local2):
    assert "PYSPARK_PYTHON" not in os.environ, "the suite must run as a user does: no PYSPARK_PYTHON"
    sc = spark_local2.sparkContext
    assert sc.pythonExec == "python3"  # Spark's own default, which would be the PATH's python3
    assert worker_python(sc) == sys.executable
    assert sc.pythonExec == "python3", "the user's other Spark jobs keep their Python"


def test_the_barrier_task_itself_needs_no_package_on_the_worker():
    """What pyspark ships for the stage (the entry point and the task spec, with the rank environment
    the runner adds) references neither this package nor its modules by name."""
    from pyspark import cloudpickle as spark_cloudpickle

    from airflow_provider_hvd.runner.driver.barrier_job import stage_function
    from airflow_provider_hvd.runner.wire.launch import LaunchEnv, TaskSpec

    spec = TaskSpec(driver_host="127.0.0.1", driver_port=1, secret_hex="00", forward_output=True,
                    env={LaunchEnv.STALL_TIMEOUT: "600", "USER_VAR": "1"}, launcher="mpi", mpi_args=("-v",))
    blob = spark_cloudpickle.dumps(stage_function(spec, ["horovod"]))
    assert not {m for m in dependencies.pickled_modules(blob) if m.startswith("airflow_provider_hvd")}
    empty = textwrap.dedent("""
        import pickle, sys
        fn = pickle.loads(sys.stdin.buffer.read())
        print(fn.func.__name__, sorted(fn.args[0]["env"]))
    """)
    # Unpickles in a Python that has only the standard library and what Spark itself puts on a
    # worker's path (pyspark.zip, py4j).
    import pyspark

    lib = Path(pyspark.__file__).parent / "python" / "lib"
    spark_path = os.pathsep.join(str(p) for p in sorted(lib.glob("*.zip")))
    out = subprocess.run([sys._base_executable, "-s", "-c", empty], input=blob, capture_output=True, timeout=60,
                         env=user_env(PYTHONPATH=spark_path))
    assert out.returncode == 0, out.stderr.decode()[-2000:]
    assert out.stdout.decode().strip() == "checked_barrier_task ['HVD_RUNNER_STALL_TIMEOUT_S', 'USER_VAR']"


def test_required_modules_come_from_the_pickle_and_the_functions_imports():
    import numpy

    def train(table):
        try:
            import apex  # noqa: F401  optional: never required
        except ImportError:
            pass
        import horovod.torch as hvd  # noqa: F401
        import json as stdlib  # noqa: F401
        return table

    call = cloudpickle.dumps((train, {"table": numpy.zeros(3)}))
    assert dependencies.required_modules(train, call) == ["cloudpickle", "horovod", "numpy"]
    # A helper of the same module, called by the function, travels with it: its imports count.
    assert dependencies.code_imports(_calls_a_helper) == {"pandas"}


def _helper():
    import pandas  # noqa: F401


def _calls_a_helper():
    return _helper()


def test_scanning_a_large_payload_copies_none_of_it():
    import tracemalloc

    big = cloudpickle.dumps({"blob": b"x" * (256 << 20), "text": "y" * (64 << 20), "m": json})
    tracemalloc.start()
    try:
        found = dependencies.pickled_modules(big)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert "json" in found
    assert peak < 1 << 20, f"the scan allocated {peak} bytes for a {len(big)}-byte payload"


BAD_WORKERS = textwrap.dedent("""
    import json, sys, time
    sys.path.insert(0, sys.argv[1])  # the driver has this module; the workers do not
    from only_on_driver import scale
    from pyspark.sql import SparkSession
    from airflow_provider_hvd import HorovodRunner
    from airflow_provider_hvd.runner.errors import WorkerEnvironmentError

    def train():
        import horovod.torch as hvd
        hvd.init()
        return hvd.rank()

    def train_with_helper():
        return scale(2)

    for case, python, fn, conf in json.loads(sys.argv[2]):
        builder = SparkSession.Builder().master("local[2]")  # a new builder: options stick to the shared one.config("spark.ui.enabled", "false")
        if python:
            builder = builder.config("spark.pyspark.python", python)
        for key, value in conf.items():
            builder = builder.config(key, value)
        spark = builder.getOrCreate()
        spark.sparkContext.setLogLevel("OFF")
        t0 = time.monotonic()
        try:
            HorovodRunner(np=2, start_timeout=90).run(train_with_helper if fn == "helper" else train)
            outcome = {"type": None}
        except Exception as exc:
            outcome = {"type": type(exc).__name__, "message": str(exc), "host": getattr(exc, "host", None),
                       "python": getattr(exc, "python", None), "module": getattr(exc, "module", None)}
        outcome.update(case=case, seconds=time.monotonic() - t0)
        print("CASE " + json.dumps(outcome), flush=True)
        spark.stop()
""")


@pytest.fixture(scope="module")
def bad_pythons(tmp_path_factory):
    """Worker Pythons that cannot run a rank, each for its own reason."""
    root = tmp_path_factory.mktemp("workers")
    empty = root / "empty"
    venv.EnvBuilder(with_pip=False).create(empty)
    # This package and cloudpickle, but no horovod (nor torch).
    partial = root / "no-horovod"
    venv.EnvBuilder(with_pip=False).create(partial)
    site = next((partial / "lib").glob("python3.*/site-packages"))
    import airflow_provider_hvd

    for module in (airflow_provider_hvd, cloudpickle):
        package = Path(module.__file__).parent
        (site / package.name).symlink_to(package)
    # An older release of this package, from before the application's worker daemon.
    older = root / "older-package"
    venv.EnvBuilder(with_pip=False).create(older)
    older_site = next((older / "lib").glob("python3.*/site-packages"))
    shutil.copytree(Path(airflow_provider_hvd.__file__).parent, older_site / "airflow_provider_hvd",
                    ignore=shutil.ignore_patterns("worker_daemon.py", "__pycache__"))
    helper_dir = root / "driver-only"
    helper_dir.mkdir()
    (helper_dir / "only_on_driver.py").write_text("def scale(x):\n    return 10 * x\n")
    return {"empty": str(empty / "bin" / "python"), "no-horovod": str(partial / "bin" / "python"),
            "older": str(older / "bin" / "python"), "helper_dir": str(helper_dir)}


@pytest.mark.faults
def test_a_worker_that_cannot_run_ranks_is_named_in_seconds(bad_pythons, tmp_path, fault):
    pypy = shutil.which("pypy3")
    assert pypy, "pypy3 (Debian's, Python 3.9) is installed by scripts/setup.sh with the test extras"
    # The unconfigured case first: a stopped SparkContext's successor in the same process keeps
    # spark.* settings the earlier one was given.
    # The operator's application also names its own worker daemon, which an empty venv cannot start:
    # last, since the settings stick (above).
    daemon = {spark_app.DAEMON_MODULE_CONF: spark_app.WORKER_DAEMON}
    cases = [("module only on the driver", None, "helper", {}),
             ("empty venv", bad_pythons["empty"], "train", {}),
             ("no horovod", bad_pythons["no-horovod"], "train", {}),
             ("Python 3.9 (PyPy)", pypy, "train", {}),
             ("no such executable", "/nonexistent/bin/python3", "train", {}),
             ("empty venv, the application's worker daemon", bad_pythons["empty"], "train", daemon),
             ("an older airflow-provider-hvd, the application's worker daemon", bad_pythons["older"], "train", daemon)]
    record = fault("worker Python without the package / horovod / a module, too old, or missing",
                   "WorkerEnvironmentError naming the module, host and executable, before any rank starts")
    script = tmp_path / "bad_workers.py"
    script.write_text(BAD_WORKERS)
    record.start()
    done = subprocess.run([sys.executable, str(script), bad_pythons["helper_dir"], json.dumps(cases)],
                          cwd=tmp_path, env=user_env(), capture_output=True, text=True, timeout=400)
    outcomes = {o["case"]: o for o in (json.loads(line[5:]) for line in done.stdout.splitlines()
                                       if line.startswith("CASE "))}
    assert len(outcomes) == len(cases), done.stdout[-3000:] + done.stderr[-3000:]
    for case, *_ in cases:
        got = outcomes[case]
        # The type says it: not a StartTimeoutError after 90 s, not Spark's bare stage failure.
        assert got["type"] == "WorkerEnvironmentError", (case, got)
        assert "spark.archives" in got["message"] and "spark.pyspark.python" in got["message"], got
    empty = outcomes["empty venv"]
    assert empty["module"] == "airflow_provider_hvd" and empty["python"] == bad_pythons["empty"]
    assert f"cannot import 'airflow_provider_hvd' in Python {bad_pythons['empty']}" in empty["message"]
    assert empty["host"] and empty["host"] != "?"
    in_daemon = outcomes["empty venv, the application's worker daemon"]
    assert in_daemon["module"] == "airflow_provider_hvd" and in_daemon["python"] == bad_pythons["empty"], in_daemon
    assert f"cannot import 'airflow_provider_hvd' in Python {bad_pythons['empty']}" in in_daemon["message"]
    older = outcomes["an older airflow-provider-hvd, the application's worker daemon"]
    assert older["module"] == spark_app.WORKER_DAEMON and "older than the driver's" in older["message"], older
    assert outcomes["no horovod"]["module"] == "horovod"
    helper = outcomes["module only on the driver"]
    assert helper["module"] == "only_on_driver" and helper["python"] == sys.executable, helper
    old = outcomes["Python 3.9 (PyPy)"]
    assert "Python 3.9" in old["message"] and pypy in old["message"], old
    missing = outcomes["no such executable"]
    assert "could not start Python '/nonexistent/bin/python3'" in missing["message"], missing
    record.observe("; ".join(f"{c}: {outcomes[c]['message'][:90]}... ({outcomes[c]['seconds']:.1f} s)"
                             for c, *_ in cases[:3]), max(o["seconds"] for o in outcomes.values()))
    assert_no_run_processes()
