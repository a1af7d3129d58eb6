"""The example DAGs under Airflow's own services (api-server, scheduler with LocalExecutor,
dag-processor, triggerer as separate processes) on PostgreSQL (Debian's server), driven through
the REST API as a user does. tests/airflow_services.py and tests/postgres_server.py start and
stop them."""

import json
import re
from pathlib import Path

from airflow_services import AirflowServices, cli, service_env
from postgres_server import PostgresServer
from test_airflow_layer import SPARK_LOG_LINE

REPO = Path(__file__).resolve().parent.parent


def task_log_lines(home: Path, dag_id: str, run_id: str, task_id: str) -> list[str]:
    """What the task's log page shows: the events of its log file, in order."""
    path = home / "logs" / f"dag_id={dag_id}" / f"run_id={run_id}" / f"task_id={task_id}" / "attempt=1.log"
    return [json.loads(line).get("event", "") for line in path.read_text().splitlines() if line.startswith("{")]


def _migrated(env: dict) -> dict:
    cli(env, "db", "migrate")
    cli(env, "dags", "reserialize")
    return env


def test_landing_data_starts_the_retraining_which_resumes_each_time(tmp_path, no_leftovers):
    home = tmp_path / "airflow"
    with PostgresServer() as postgres, \
            AirflowServices(_migrated(service_env(home, REPO / "dags", HVD_EXAMPLE_STORAGE=f"file://{tmp_path}/storage",
                                                  AIRFLOW__DATABASE__SQL_ALCHEMY_CONN=postgres.url)),
                            tmp_path / "service-logs") as airflow:
        airflow.api("PATCH", "/dags/hvd_scheduled_retraining", {"is_paused": False})
        # Scheduled on its data asset alone: nothing runs until data lands.
        assert airflow.api("GET", "/dags/hvd_scheduled_retraining/dagRuns")["total_entries"] == 0
        # The ingest DAG lands data on its own schedule (daily: unpausing it runs the latest day).
        airflow.api("PATCH", "/dags/hvd_digits_ingest", {"is_paused": False})
        ingest = airflow.wait_for_runs("hvd_digits_ingest", 1, timeout=120)
        assert ingest[0]["state"] == "success" and ingest[0]["run_type"] == "scheduled"
        first = airflow.wait_for_runs("hvd_scheduled_retraining", 1, timeout=300)[0]
        assert first["run_type"] == "asset_triggered" and first["state"] == "success", first
        events = airflow.api("GET", f"/dags/hvd_scheduled_retraining/dagRuns/{first['dag_run_id']}"
                                    "/upstreamAssetEvents")["asset_events"]
        assert [(e["name"], e["source_dag_id"]) for e in events] == [("hvd_digits_data", "hvd_digits_ingest")]

        # New data announced from outside Airflow (a data pipeline calling the REST API) starts another
        # run, which continues from the first one's checkpoint.
        asset = airflow.api("GET", "/assets?name_pattern=hvd_digits_data")["assets"][0]
        airflow.api("POST", "/assets/events", {"asset_id": asset["id"], "extra": {"from": "test"}})
        runs = airflow.wait_for_runs("hvd_scheduled_retraining", 2, timeout=300)
        second = runs[-1]
        assert second["run_type"] == "asset_triggered" and second["state"] == "success", runs
        # ... all of it kept in PostgreSQL.
        assert postgres.query("SELECT count(*) FROM dag_run WHERE dag_id = 'hvd_scheduled_retraining' "
                              "AND run_type = 'asset_triggered' AND state = 'success'") == "2"

    # Nothing of the deployment is left: no Airflow service (their process groups), no PostgreSQL.
    import psutil

    left = [p.info["cmdline"] for p in psutil.process_iter(["cmdline"])
            if any(str(tmp_path) in part or postgres.root in part for part in (p.info["cmdline"] or []))]
    assert not left, left
    first_log = task_log_lines(home, "hvd_scheduled_retraining", first["dag_run_id"], "retrain")
    second_log = task_log_lines(home, "hvd_scheduled_retraining", second["dag_run_id"], "retrain")
    assert any("training starts fresh" in line for line in first_log), first_log[-40:]
    resumed = [line for line in second_log if line.startswith("Resuming from checkpoint")]
    assert resumed and "/models/digits/checkpoints/ckpt-" in resumed[0], second_log[-40:]
    # The task log reads as a training log: the ranks' lines, and of Spark's INFO lines only the one
    # that says where its UI is (the JVM starts with our log4j2 configuration, under the scheduler too).
    assert any(re.match(r"\[0\]<log>: epoch \d+:", line) for line in first_log), first_log[-40:]
    spark_info = [line for line in first_log if SPARK_LOG_LINE.fullmatch(line) and " INFO " in line]
    assert spark_info and all(" INFO SparkUI:" in line for line in spark_info), spark_info
    for name in ("scheduler", "triggerer", "dag-processor", "api-server"):
        assert "Traceback" not in (tmp_path / "service-logs" / f"{name}.log").read_text(), name
