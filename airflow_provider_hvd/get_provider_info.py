"""Provider metadata read by Airflow's providers manager (entry point ``apache_airflow_provider``)."""

from __future__ import annotations

from airflow_provider_hvd import __version__


# The ``horovod`` connection's form, read by Airflow's UI without importing the hook (Airflow >= 3.2).
# The extra fields are the settings HorovodHook.setting() reads, and only those: storage_path,
# kubernetes_secret and every runner option of runner/defaults.OPTIONS (tested).
CONN_FIELDS = {
    "storage_path": {
        "label": "Storage path",
        "description": "Where payloads, results, timelines and checkpoints go: any ObjectStoragePath URL "
                       "(s3://conn_id@bucket/prefix, file:///shared/...). Default: the operator's storage_path, "
                       "else file:///tmp/airflow-provider-hvd.",
        "schema": {"type": ["string", "null"]},
    },
    "kubernetes_secret": {
        "label": "Kubernetes Secret with the key",
        "description": "For deploy mode cluster on Kubernetes: <secret name>:<key> of a Secret in the driver's "
                       "namespace that holds this connection's signing key (hex).",
        "schema": {"type": ["string", "null"]},
    },
    "cluster_spark_app": {
        "label": "spark_app.py on the cluster",
        "description": "For deploy mode cluster on a standalone master: the path of airflow_provider_hvd/runner/"
                       "spark_app.py on the Spark hosts, where it is not the same as on the Airflow worker.",
        "schema": {"type": ["string", "null"]},
    },
    "cluster_spark_jar": {
        "label": "Spark jar on the cluster",
        "description": "For deploy mode cluster on a standalone master: a jar path every Spark host has (default: "
                       "this host's pyspark jars/spark-core_*.jar).",
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
    "mpi_args": {
        "label": "Extra mpirun arguments",
        "description": 'For launcher mpi: one string ("-mca btl tcp,self") or a JSON list.',
        "schema": {"type": ["string", "array", "null"]},
    },
    "start_timeout": {
        "label": "Start timeout (s)",
        "description": "Seconds for every rank to start (default 120).",
        "schema": {"type": ["number", "null"], "exclusiveMinimum": 0},
    },
    "stall_timeout": {
        "label": "Stall timeout (s)",
        "description": "Seconds a rank may wait in a collective the others never join (default 600; \"none\": forever).",
        "schema": {"type": ["number", "string", "null"]},
    },
    "timeout": {
        "label": "Run timeout (s)",
        "description": "Seconds for the whole training run (default: no limit).",
        "schema": {"type": ["number", "string", "null"]},
    },
    "slot_wait_timeout": {
        "label": "Slot wait (s)",
        "description": "Seconds to wait for np free task slots, before the first attempt and each restart "
                       "(default 30; raise it on an autoscaling cluster).",
        "schema": {"type": ["number", "null"], "minimum": 0},
    },
    "timeline_interval": {
        "label": "Timeline refresh (s)",
        "description": "Seconds between refreshes of the timeline's live view (default 5).",
        "schema": {"type": ["number", "null"], "exclusiveMinimum": 0},
    },
    "timeline_live_bytes": {
        "label": "Timeline live view (bytes)",
        "description": "Size of the live view's window of recent events (default 8 MiB; 0: no live view).",
        "schema": {"type": ["integer", "null"], "minimum": 0},
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
            {"integration-name": "Horovod", "python-modules": ["airflow_provider_hvd.hooks.horovod",
                                                                   "airflow_provider_hvd.hooks.spark_submit",
                                                                   "airflow_provider_hvd.hooks.standalone_driver"]},
        ],
        "operators": [
            {"integration-name": "Horovod", "python-modules": ["airflow_provider_hvd.operators.horovod_runner"]},
        ],
        "sensors": [
            {"integration-name": "Horovod", "python-modules": ["airflow_provider_hvd.sensors.horovod_artifact"]},
        ],
        "triggers": [
            {"integration-name": "Horovod", "python-modules": ["airflow_provider_hvd.triggers.horovod_artifact",
                                                                   "airflow_provider_hvd.triggers.horovod_driver"]},
        ],
        "extra-links": [
            "airflow_provider_hvd.links.horovod.SparkUILink",
            "airflow_provider_hvd.links.horovod.HorovodTimelineLink",
            "airflow_provider_hvd.links.horovod.CheckpointsLink",
        ],
        "connection-types": [
            {"connection-type": "horovod", "hook-class-name": "airflow_provider_hvd.hooks.horovod.HorovodHook",
             "hook-name": "Horovod", "conn-fields": CONN_FIELDS, "ui-field-behaviour": UI_FIELD_BEHAVIOUR},
        ],
    }
