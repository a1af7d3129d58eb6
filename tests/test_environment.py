"""The environment is real: horovod with gloo and MPI, Spark barrier mode, Airflow sees the provider."""

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent

ALLREDUCE = """
import horovod.torch as hvd, torch
hvd.init()
total = hvd.allreduce(torch.tensor([float(hvd.rank() + 1)]), op=hvd.Sum).item()
import sys
sys.stdout.write(f"RESULT rank={hvd.rank()} size={hvd.size()} sum={total} mpi={hvd.mpi_enabled()}\\n")
sys.stdout.flush()
"""


@pytest.fixture(scope="module")
def allreduce_script(tmp_path_factory):
    path = tmp_path_factory.mktemp("env") / "allreduce.py"
    path.write_text(ALLREDUCE)
    return path


def results(stdout):
    # Matched anywhere, not line by line: mpirun forwards each rank's output as it comes, and CI
    # once saw rank 1's line land before rank 0's newline.
    return sorted(re.findall(r"RESULT (rank=\d+ size=\d+ sum=[\d.]+ mpi=(?:True|False))", stdout))


def test_horovodrun_gloo_two_ranks(allreduce_script):
    done = subprocess.run([str(BIN / "horovodrun"), "-np", "2", "--gloo", sys.executable, str(allreduce_script)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert results(done.stdout) == ["rank=0 size=2 sum=3.0 mpi=False", "rank=1 size=2 sum=3.0 mpi=False"]


def test_mpirun_two_ranks(allreduce_script):
    mpirun = shutil.which("mpirun")
    assert mpirun, "OpenMPI is part of the environment: run scripts/setup.sh"
    root = ["--allow-run-as-root"] if os.geteuid() == 0 else []
    done = subprocess.run([mpirun, *root, "--oversubscribe", "-np", "2", "-x", "PATH", sys.executable,
                           str(allreduce_script)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert results(done.stdout) == ["rank=0 size=2 sum=3.0 mpi=True", "rank=1 size=2 sum=3.0 mpi=True"]


def test_spark_barrier_stage_local2(spark_local2):
    def task(_):
        from pyspark import BarrierTaskContext
        ctx = BarrierTaskContext.get()
        ctx.barrier()
        yield (ctx.partitionId(), len(ctx.getTaskInfos()))

    got = spark_local2.sparkContext.parallelize(range(2), 2).barrier().mapPartitions(task).collect()
    assert sorted(got) == [(0, 2), (1, 2)]


@pytest.fixture(scope="module")
def airflow_env(tmp_path_factory):
    home = tmp_path_factory.mktemp("airflow_home")
    env = {**os.environ, "AIRFLOW_HOME": str(home), "AIRFLOW__CORE__DAGS_FOLDER": str(REPO / "dags"),
           "AIRFLOW__CORE__LOAD_EXAMPLES": "False"}
    done = subprocess.run([str(BIN / "airflow"), "db", "migrate"], env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return env


def airflow_json(env, *args):
    done = subprocess.run([str(BIN / "airflow"), *args, "-o", "json"], env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    # Airflow may log before the JSON document; the document is the last line that is a JSON list.
    lines = [line for line in done.stdout.splitlines() if line.startswith("[{") or line.strip() == "[]"]
    assert lines, done.stdout[-3000:]
    return json.loads(lines[-1])


def test_airflow_sees_the_provider(airflow_env):
    providers = {p["package_name"]: p for p in airflow_json(airflow_env, "providers", "list")}
    assert "airflow-provider-hvd" in providers
    from airflow_provider_hvd.get_provider_info import get_provider_info
    assert get_provider_info()["package-name"] == "airflow-provider-hvd"


def test_airflow_dags_list_is_clean(airflow_env):
    # --local parses the dags/ folder now (the DB holds only what a dag-processor has serialised).
    assert airflow_json(airflow_env, "dags", "list-import-errors", "--local") == []
    listed = {d["dag_id"] for d in airflow_json(airflow_env, "dags", "list", "--local")}
    for path in (REPO / "dags").glob("*.py"):
        assert path.stem in listed, f"{path.name} defines no DAG named after it (listed: {sorted(listed)})"
