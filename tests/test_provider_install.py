"""The provider dropped into an Airflow that has no torch, no horovod and no training pyspark,
as a platform engineer's Airflow image is: the oldest Airflow 3 and Spark provider the package
claims (the lower bounds of its `airflow` extra, every other package as of
[tool.airflow-provider-hvd.pins].oldest_resolution_date) and the newest that resolves today.

Each environment is fresh (uv, from the package registry), holds the built wheel with its
`airflow` and `examples` extras, and must pass `pip check`, list the provider, parse every
example DAG and run `hvd_mnist_pytorch` end to end. Its Spark driver and executors run in a
separate training environment (this repository's .venv: pyspark, torch, horovod), chosen the
way a deployment chooses it: Spark's own spark-defaults.conf (spark.pyspark.python and
spark.pyspark.driver.python) in SPARK_CONF_DIR, and that environment's Spark as SPARK_HOME.
"""

import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import early
import pytest
from conftest import LOCAL_SPARK_CONNECTION, assert_no_run_processes, user_env

REPO = Path(__file__).resolve().parent.parent
UV = Path(sys.executable).parent / "uv"
TRAINING_PYTHON = Path(sys.executable)  # .venv: the training environment
EXAMPLE_DAGS = {"hvd_allreduce_smoke", "hvd_digits_ingest", "hvd_mnist_pytorch", "hvd_mnist_tensorflow",
                "hvd_scheduled_retraining"}


def pyproject() -> dict:
    with (REPO / "pyproject.toml").open("rb") as f:
        return tomllib.load(f)


def lower_bounds() -> list[str]:
    """The `airflow` extra's requirements with their lower bound made exact: what the package claims to run on."""
    pins = []
    for requirement in pyproject()["project"]["optional-dependencies"]["airflow"]:
        name, bound = re.fullmatch(r"([\w.-]+)>=([\w.]+)(?:,.*)?", requirement).groups()
        pins.append(f"{name}=={bound}")
    return pins


def run(cmd, env=None, timeout=900, cwd=None):
    done = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=timeout, env=env, cwd=cwd)
    assert done.returncode == 0, f"{cmd}:\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
    return done.stdout + done.stderr


def json_list(output: str) -> list:
    """The JSON list an `airflow ... -o json` command printed among its log lines."""
    return json.loads(next(line for line in output.splitlines() if line.startswith("[")))


def airflow_environment(which: str, built_distributions, sdist_wheels) -> dict:
    """A fresh environment with the built wheel's `airflow` and `examples` extras: the oldest Airflow the
    package claims, or the newest that resolves."""
    venv = early.folder(f"airflow-{which}") / "airflow-venv"
    run([*early.NICE, UV, "venv", "-q", "--seed", "-p", sys._base_executable, venv])
    python = venv / "bin" / "python"
    wheel = built_distributions["wheel"]
    install = [*early.NICE, UV, "pip", "install", "-q", "-p", python, f"{wheel}[airflow,examples]"]
    if which == "oldest":
        install += [*lower_bounds(), "--exclude-newer",
                    pyproject()["tool"]["airflow-provider-hvd"]["pins"]["oldest_resolution_date"]]
    else:
        # pyspark's wheel, built from the same sdist. Not for "oldest": a local file has no upload
        # date, and pyspark 4.2 did not exist on that date.
        install += ["--find-links", sdist_wheels]
    run(install, env=user_env())
    return {"which": which, "venv": venv, "python": python}


@early.step("airflow_venv", needs=("distributions", "pyspark_wheels"))
def oldest_airflow(built_distributions, sdist_wheels) -> dict:
    return airflow_environment("oldest", built_distributions, sdist_wheels)


@early.step("airflow_venv", needs=("distributions", "pyspark_wheels"))
def newest_airflow(built_distributions, sdist_wheels) -> dict:
    return airflow_environment("newest", built_distributions, sdist_wheels)


@pytest.fixture
def airflow_venv(request) -> dict:
    return early.result(f"{request.param}_airflow")


@pytest.mark.parametrize("airflow_venv", ["oldest", "newest"], indirect=True)
def test_the_provider_in_an_airflow_without_the_training_stack(airflow_venv, tmp_path, no_leftovers):
    which, venv, python = airflow_venv["which"], airflow_venv["venv"], airflow_venv["python"]
    versions = json.loads(run([python, "-c", "import json, importlib.metadata as m; print(json.dumps("
                               "{p: m.version(p) for p in ('apache-airflow', 'apache-airflow-providers-apache-spark')}))"]))
    if which == "oldest":
        assert [f"{name}=={version}" for name, version in versions.items()] == lower_bounds()
    print(f"{which}: {versions}")
    run([python, "-m", "pip", "check"])
    # The Airflow side imports neither torch nor horovod (the callable does, on the ranks).
    missing = run([python, "-c", "import importlib.util as u; print([m for m in ('torch', 'horovod') "
                                 "if u.find_spec(m) is None])"])
    assert missing.strip().endswith("['torch', 'horovod']"), missing

    home, storage, spark_conf = tmp_path / "airflow", tmp_path / "storage", tmp_path / "spark-conf"
    spark_conf.mkdir()
    (spark_conf / "spark-defaults.conf").write_text(f"spark.pyspark.python {TRAINING_PYTHON}\n"
                                                    f"spark.pyspark.driver.python {TRAINING_PYTHON}\n")
    spark_home = TRAINING_PYTHON.parent.parent / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / \
        "site-packages" / "pyspark"
    env = user_env(AIRFLOW_HOME=str(home), AIRFLOW__CORE__DAGS_FOLDER=str(REPO / "dags"),
                   AIRFLOW__CORE__LOAD_EXAMPLES="False", HVD_EXAMPLE_STORAGE=f"file://{storage}",
                   AIRFLOW_CONN_SPARK_DEFAULT=LOCAL_SPARK_CONNECTION,
                   SPARK_HOME=str(spark_home), SPARK_CONF_DIR=str(spark_conf),
                   PATH=f"{spark_home / 'bin'}:{venv / 'bin'}:/usr/bin:/bin")
    airflow = venv / "bin" / "airflow"
    run([airflow, "db", "migrate"], env=env, cwd=tmp_path, timeout=300)
    providers = run([airflow, "providers", "list"], env=env, cwd=tmp_path)
    assert re.search(r"^airflow-provider-hvd\s*\|", providers, re.M), providers[-3000:]
    run([airflow, "dags", "reserialize"], env=env, cwd=tmp_path)
    errors = run([airflow, "dags", "list-import-errors", "-o", "json"], env=env, cwd=tmp_path)
    assert "No data found" in errors or json_list(errors) == [], errors[-4000:]
    listed = run([airflow, "dags", "list", "-o", "json"], env=env, cwd=tmp_path)
    assert {d["dag_id"] for d in json_list(listed)} == EXAMPLE_DAGS

    out = run([airflow, "dags", "test", "hvd_mnist_pytorch", "-c", json.dumps({"epochs": 8})], env=env,
              cwd=tmp_path, timeout=600)
    assert "state=success" in out, out[-5000:]
    assert float(out.split("test accuracy ")[1].split()[0]) >= 0.9, out[-3000:]
    assert "--conf spark.pyspark.python=" not in out  # Spark's own configuration chose the training Python
    assert_no_run_processes()
