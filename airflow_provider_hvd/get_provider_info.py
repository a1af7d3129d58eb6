"""Provider metadata read by Airflow's providers manager (entry point ``apache_airflow_provider``)."""

from __future__ import annotations

from airflow_provider_hvd import __version__
from airflow_provider_hvd.runner.defaults import OPTIONS


# The ``horovod`` connection's form, read by Airflow's UI without importing the hook (Airflow >= 3.2).
# The extra fields are the settings HorovodHook.setting() reads, and only those: where runs keep their
# files, what cluster mode needs, and every runner option of runner/defaults.OPTIONS (tested).
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
    # Every runner option, as runner/defaults.py defines it.
    **{option.name: {"label": option.label, "description": f"{option.help.replace('`', '')} (default {option.shown_default()}).",
                     "schema": option.schema} for option in OPTIONS.values()},
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
