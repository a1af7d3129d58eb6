#!/usr/bin/env bash
# The main job end to end on the embedded default: the hvd_mnist_pytorch DAG through
# `airflow dags test`, with Airflow on SQLite (AIRFLOW_HOME=.airflow unless set),
# Spark local[*] and local files under /tmp/airflow-provider-hvd.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
export AIRFLOW_HOME=${AIRFLOW_HOME:-$repo/.airflow}
export AIRFLOW__CORE__DAGS_FOLDER=${AIRFLOW__CORE__DAGS_FOLDER:-$repo/dags}
export AIRFLOW__CORE__LOAD_EXAMPLES=${AIRFLOW__CORE__LOAD_EXAMPLES:-False}
# The embedded default: the spark_default connection is Spark local[*] on this machine (a
# connection that does not exist is an error, never a silent fallback).
export AIRFLOW_CONN_SPARK_DEFAULT=${AIRFLOW_CONN_SPARK_DEFAULT:-'{"conn_type": "spark", "host": "local[*]"}'}
airflow="$repo/.venv/bin/airflow"
echo "==> [demo] Airflow metadata DB in $AIRFLOW_HOME (SQLite)"
"$airflow" db migrate >/dev/null
echo "==> [demo] airflow dags test hvd_mnist_pytorch (Spark local[*], file storage)"
"$airflow" dags test hvd_mnist_pytorch "$@"
