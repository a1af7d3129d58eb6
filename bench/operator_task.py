"""The whole Airflow task, ours against what the apache-spark provider offers today.

`airflow tasks test` of bench/dags/hvd_bench_tasks.py, SQLite, interleaved, in two settings:

Spark ``local[2]``, storage on local disk:
- ``ours_client``: HorovodRunnerOperator(np=2) for a trivial allreduce (payload signed into storage,
  spark-submit of our application, rank 0's result verified back);
- ``peer_horovod_spark_run``: SparkSubmitOperator running a script that calls horovod.spark.run for the
  same function;
- ``nothing``: a task that returns 1, i.e. what `airflow tasks test` itself costs (process start, DAG
  parse, metadata); the "net" column subtracts it.

A standalone master with two workers (2 cores each, master REST server on) on loopback, storage on S3
through moto's server (the stand-in for a bucket; cluster mode needs storage the cluster can read):
- ``ours_client_cluster``, ``ours_cluster`` (the driver on a worker, followed through the master's REST
  server, its output through storage) and ``ours_deferrable_cluster`` (the same, handed to the trigger,
  which `airflow tasks test` runs in its own process);
- ``peer_horovod_spark_run_cluster``: the peer in client mode (spark-submit refuses a Python
  application in standalone cluster mode).
"""

from __future__ import annotations

import json
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from measure import stats

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
AIRFLOW = str(Path(sys.executable).parent / "airflow")
LOCAL_TASKS = {"ours_client": "HorovodRunnerOperator, client mode",
               "peer_horovod_spark_run": "SparkSubmitOperator + horovod.spark.run",
               "nothing": "a task that does nothing"}
CLUSTER_TASKS = {"ours_client_cluster": "HorovodRunnerOperator, client mode",
                 "ours_cluster": "HorovodRunnerOperator, cluster mode (followed by the task)",
                 "ours_deferrable_cluster": "HorovodRunnerOperator, cluster mode, deferrable",
                 "peer_horovod_spark_run_cluster": "SparkSubmitOperator (client mode) + horovod.spark.run",
                 "nothing": "a task that does nothing"}
PEER = {"local": "peer_horovod_spark_run", "cluster": "peer_horovod_spark_run_cluster"}


def _airflow_env(home: Path, **extra: str) -> dict[str, str]:
    env = {**os.environ, "AIRFLOW_HOME": str(home), "AIRFLOW__CORE__DAGS_FOLDER": str(HERE / "dags"),
           "AIRFLOW__CORE__LOAD_EXAMPLES": "False", "SPARK_LOCAL_IP": "127.0.0.1",
           "AIRFLOW_CONN_SPARK_DEFAULT": json.dumps({"conn_type": "spark", "host": "local[2]"}),
           "AIRFLOW_CONN_HOROVOD_DEFAULT": json.dumps({"conn_type": "horovod",
                                                       "extra": {"storage_path": f"file://{home}/storage"}}),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}", **extra}
    subprocess.run([AIRFLOW, "db", "migrate"], env=env, check=True, capture_output=True, timeout=600)
    return env


def _time_tasks(env: dict[str, str], tasks: dict[str, str], reps: int, label: str) -> dict:
    def run(task_id: str) -> float:
        t0 = time.perf_counter()
        done = subprocess.run([AIRFLOW, "tasks", "test", "hvd_bench_tasks", task_id], env=env, capture_output=True,
                              text=True, timeout=600)
        elapsed = time.perf_counter() - t0
        out = done.stdout + done.stderr
        # `airflow tasks test` exits 0 even when the task failed: read its verdict.
        if done.returncode != 0 or "new_state=success" not in out:
            raise RuntimeError(f"bench task {task_id} failed:\n{out[-4000:]}")
        return elapsed

    for task_id in tasks:  # warm-up: page cache, the DAG's first serialisation
        run(task_id)
    times: dict[str, list[float]] = {task_id: [] for task_id in tasks}
    for rep in range(reps):
        for task_id in tasks:
            times[task_id].append(run(task_id))
        print(f"  operator task ({label}) rep {rep + 1}/{reps}: " +
              ", ".join(f"{t} {times[t][-1]:.2f}s" for t in tasks), flush=True)
    # Each repetition's times are kept: the tasks of one repetition ran back to back, so their ratio
    # (_paired_ratios) is steadier than the ratio of medians on a machine whose speed drifts.
    return {task_id: {**stats(v), "values": v} for task_id, v in times.items()}


def operator_task_cost(reps: int) -> dict:
    home = Path(tempfile.mkdtemp(prefix="hvd-bench-airflow-"))
    return {"local": _time_tasks(_airflow_env(home), LOCAL_TASKS, reps, "local[2]"),
            "cluster": operator_task_cost_cluster(reps)}


def operator_task_cost_cluster(reps: int) -> dict:
    """The cluster setting: a standalone master and two workers (tests/spark_cluster.py) and moto's S3."""
    import fsspec
    from restarts import _moto

    sys.path.insert(0, str(REPO / "tests"))
    from spark_cluster import StandaloneCluster

    home = Path(tempfile.mkdtemp(prefix="hvd-bench-airflow-cluster-"))
    (home / "cluster").mkdir()
    server, endpoint = _moto()
    cluster = StandaloneCluster(home / "cluster", cores_per_worker=2, memory="2g", rest=True).start()
    try:
        aws = {"AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench",
               "AWS_DEFAULT_REGION": "us-east-1"}
        os.environ.update(aws)
        fsspec.filesystem("s3", skip_instance_cache=True).mkdir("hvd-bench-tasks")
        env = _airflow_env(
            home, **aws, SPARK_LOCAL_HOSTNAME="127.0.0.1", PYSPARK_PYTHON=sys.executable,
            AIRFLOW_CONN_SPARK_BENCH_CLUSTER=json.dumps(cluster.connection()),
            # A signing key of the connection's: deferrable needs one (the task resumes in a new process).
            AIRFLOW_CONN_HOROVOD_DEFAULT=json.dumps({"conn_type": "horovod", "password": secrets.token_hex(32),
                                                     "extra": {"storage_path": "s3://hvd-bench-tasks/runs"}}),
            AIRFLOW_CONN_AWS_DEFAULT=json.dumps({"conn_type": "aws", "login": "bench", "password": "bench",
                                                 "extra": {"endpoint_url": endpoint, "region_name": "us-east-1"}}))
        return _time_tasks(env, CLUSTER_TASKS, reps, "standalone cluster")
    finally:
        cluster.stop()
        server.terminate()
        server.wait(30)


def _paired_ratios(cost: dict, task_id: str, peer_id: str) -> list[float]:
    """Per repetition: this task's net time over the peer's, both net of the same repetition's task that
    does nothing (empty for a report stored before the values were kept)."""
    runs = zip(cost[task_id].get("values", []), cost[peer_id].get("values", []), cost["nothing"].get("values", []))
    return [(ours - nothing) / (peer - nothing) for ours, peer, nothing in runs]


def _table(cost: dict, tasks: dict[str, str], peer_id: str) -> list[str]:
    base = cost["nothing"]["median"]
    peer = cost[peer_id]["median"]
    lines = ["| task | median s | min-max s | net s | net ratio to the peer | per repetition: median (range) |",
             "| --- | --- | --- | --- | --- | --- |"]
    for task_id, label in tasks.items():
        s = cost[task_id]
        net = s["median"] - base
        ratio = paired = ""
        if task_id not in ("nothing", peer_id):
            ratio = f"{net / (peer - base):.2f}"
            pairs = _paired_ratios(cost, task_id, peer_id)
            if pairs:
                paired = f"{statistics.median(pairs):.2f} ({min(pairs):.2f}-{max(pairs):.2f})"
        lines.append(f"| {label} | {s['median']:.2f} | {s['min']:.2f}-{s['max']:.2f} | {net:.2f} | {ratio} "
                     f"| {paired} |")
    return lines


def _net_ratio(cost: dict, task_id: str, peer_id: str) -> float:
    base = cost["nothing"]["median"]
    return (cost[task_id]["median"] - base) / (cost[peer_id]["median"] - base)


def report_lines(cost: dict | None) -> list[str]:
    if not cost:
        return ["## The whole Airflow task", "", "Not measured in this run (`bench/run.py --only operator`).", ""]
    if "local" not in cost:  # a report stored before the cluster setting existed
        cost = {"local": cost}
    lines = ["## The whole Airflow task: `airflow tasks test`, a trivial 2-rank allreduce", "",
             "Wall time of `airflow tasks test` for each task of bench/dags/hvd_bench_tasks.py, interleaved; "
             "*net* subtracts the task that does nothing (Airflow's own start, DAG parse and metadata). The peer: "
             "the apache-spark provider's SparkSubmitOperator running a script that calls `horovod.spark.run` for "
             "the same function.", "", "### Spark `local[2]`, storage on local disk", "",
             *_table(cost["local"], LOCAL_TASKS, PEER["local"]), ""]
    goal = [f"client mode {_net_ratio(cost['local'], 'ours_client', PEER['local']):.2f} on local[2]"]
    if "cluster" in cost:
        lines += ["### Standalone master + 2 workers on loopback, storage on S3 (moto's server, a stand-in)", "",
                  "Ours in cluster mode includes following the driver through the master's REST server (0.25 s "
                  "polls for the first 30 s) and its output through storage; deferrable includes the trigger's start in "
                  "`airflow tasks test` and the task's resumption. The peer runs in client mode: spark-submit "
                  "refuses a Python application in standalone cluster mode.", "",
                  *_table(cost["cluster"], CLUSTER_TASKS, PEER["cluster"]), ""]
        goal += [f"{label} {_net_ratio(cost['cluster'], task_id, PEER['cluster']):.2f} on the cluster"
                 for task_id, label in (("ours_client_cluster", "client mode"), ("ours_cluster", "cluster mode"),
                                        ("ours_deferrable_cluster", "deferrable"))]
    lines += [f"Goal (issue 18): ours at most 0.5 of the peer's, net. Measured (ratio of the net medians): "
              f"{'; '.join(goal)}. The last column pairs each repetition's tasks, which ran back to back.", ""]
    return lines
