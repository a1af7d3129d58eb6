"""Provider metadata read by Airflow's providers manager (entry point ``apache_airflow_provider``)."""

from __future__ import annotations

from airflow_provider_hvd import __version__


# The ``horovod`` connection's form, read by Airflow's UI without importing the hook (Airflow >= 3.2).
# The extra fields are the settings HorovodHook.setting() reads, and only those (tested).
CONN_FIELDS = {
    "storage_path": {
        "label": "Storage path",
        "description": "Where payloads, results, timelines and checkpoints go: any ObjectStoragePath URL "
                       "(s3://conn_id@bucket/prefix, file:///shared/...). Default: the operator's storage_path, "
                       "else file:///tmp/airflow-provider-hvd.",
        "schema": {"type": ["string", "null"]},
    },
    "launcher": {
        "label": "Launcher",
        "description": "mpi, gloo, or auto (mpi when OpenMPI and an MPI-enabled horovod are present).",
        "schema": {"type": ["string", "null"], "enum": ["auto", "gloo", "mpi", None]},
    },
    "driver_log_verbosity": {
        "label": "Rank output in the task log",
        "description": "all: every rank's stdout and stderr; log_callback_only: only log_to_driver messages.",
        "schema": {"type": ["string", "null"], "enum": ["all", "log_callback_only", None]},
    },
    "max_restarts": {
        "label": "Max restarts",
        "description": "Restarts of the ranks inside a task after a lost executor, host or rank, each from the "
                       "run's newest checkpoint (default 0).",
        "schema": {"type": ["integer", "null"], "minimum": 0},
    },
}
UI_FIELD_BEHAVIOUR = {
    "hidden-fields": ["host", "schema", "login", "port"],
    "relabeling": {"password": "Signing key (hex)"},
    "placeholders": {
        "password": "leave empty to make a new key for each run",
        "storage_path": "s3://aws_default@bucket/horovod",
    },
}


def get_provider_info() -> dict:
    return {
        "package-name": "airflow-provider-hvd",
        "name": "Horovod on Spark",
        "description": "Run distributed deep-learning training (Horovod, in a Spark barrier stage) "
        "from Apache Airflow: HorovodRunner for open-source Spark.",
        "versions": [__version__],
        "integrations": [
            {"integration-name": "Horovod", "external-doc-url": "https://horovod.readthedocs.io/",
             "tags": ["software"]},
        ],
        "hooks": [
            {"integration-name": "Horovod", "python-modules": ["airflow_provider_hvd.hooks.horovod"]},
        ],
        "operators": [
            {"integration-name": "Horovod", "python-modules": ["airflow_provider_hvd.operators.horovod_runner"]},
        ],
        "sensors": [
            {"integration-name": "Horovod", "python-modules": ["airflow_provider_hvd.sensors.horovod_artifact"]},
        ],
        "triggers": [
            {"integration-name": "Horovod", "python-modules": ["airflow_provider_hvd.triggers.horovod_artifact"]},
        ],
        "connection-types": [
            {"connection-type": "horovod", "hook-class-name": "airflow_provider_hvd.hooks.horovod.HorovodHook",
             "hook-name": "Horovod", "conn-fields": CONN_FIELDS, "ui-field-behaviour": UI_FIELD_BEHAVIOUR},
        ],
    }
