"""The whole Airflow task, ours against what the apache-spark provider offers today.

`airflow tasks test` of bench/dags/hvd_bench_tasks.py, Spark `local[2]`, SQLite, interleaved:
- ``ours_client``: HorovodRunnerOperator(np=2) for a trivial allreduce (payload signed into storage,
  spark-submit of our application, rank 0's result verified back);
- ``peer_horovod_spark_run``: SparkSubmitOperator running a script that calls horovod.spark.run for the
  same function;
- ``nothing``: a task that returns 1, i.e. what `airflow tasks test` itself costs (process start, DAG
  parse, metadata); the "net" column subtracts it.
Client mode only: cluster and deferrable modes do not exist yet (issue 18).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from measure import stats

HERE = Path(__file__).resolve().parent
AIRFLOW = str(Path(sys.executable).parent / "airflow")
TASKS = {"ours_client": "HorovodRunnerOperator, client mode",
         "peer_horovod_spark_run": "SparkSubmitOperator + horovod.spark.run",
         "nothing": "a task that does nothing"}


def operator_task_cost(reps: int) -> dict:
    home = Path(tempfile.mkdtemp(prefix="hvd-bench-airflow-"))
    env = {**os.environ, "AIRFLOW_HOME": str(home), "AIRFLOW__CORE__DAGS_FOLDER": str(HERE / "dags"),
           "AIRFLOW__CORE__LOAD_EXAMPLES": "False", "SPARK_LOCAL_IP": "127.0.0.1",
           "AIRFLOW_CONN_SPARK_DEFAULT": json.dumps({"conn_type": "spark", "host": "local[2]"}),
           "AIRFLOW_CONN_HOROVOD_DEFAULT": json.dumps({"conn_type": "horovod",
                                                       "extra": {"storage_path": f"file://{home}/storage"}}),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    subprocess.run([AIRFLOW, "db", "migrate"], env=env, check=True, capture_output=True, timeout=600)

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

    for task_id in TASKS:  # warm-up: page cache, the DAG's first serialisation
        run(task_id)
    times: dict[str, list[float]] = {task_id: [] for task_id in TASKS}
    for rep in range(reps):
        for task_id in TASKS:
            times[task_id].append(run(task_id))
        print(f"  operator task rep {rep + 1}/{reps}: " + ", ".join(f"{t} {times[t][-1]:.2f}s" for t in TASKS),
              flush=True)
    return {task_id: stats(v) for task_id, v in times.items()}


def report_lines(cost: dict | None) -> list[str]:
    if not cost:
        return ["## The whole Airflow task", "", "Not measured in this run (`bench/run.py --only operator`).", ""]
    base = cost["nothing"]["median"]
    peer = cost["peer_horovod_spark_run"]["median"]
    lines = ["## The whole Airflow task: `airflow tasks test`, a trivial 2-rank allreduce, Spark `local[2]`", "",
             "Wall time of `airflow tasks test` for each task of bench/dags/hvd_bench_tasks.py, interleaved; "
             "*net* subtracts the task that does nothing (Airflow's own start, DAG parse and metadata).", "",
             "| task | median s | min-max s | net s | net ratio to SparkSubmitOperator + horovod.spark.run |",
             "| --- | --- | --- | --- | --- |"]
    for task_id, label in TASKS.items():
        s = cost[task_id]
        net = s["median"] - base
        ratio = "" if task_id == "nothing" else f"{net / (peer - base):.2f}"
        lines.append(f"| {label} | {s['median']:.2f} | {s['min']:.2f}-{s['max']:.2f} | "
                     f"{net:.2f} | {ratio} |")
    ours = (cost["ours_client"]["median"] - base) / (peer - base)
    lines += ["", f"Goal (issue 18): ours at most 0.5 of the peer's. Client mode: {ours:.2f} net, "
              f"{cost['ours_client']['median'] / peer:.2f} whole. Cluster and deferrable modes are not built yet.", ""]
    return lines
